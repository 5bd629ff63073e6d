"""Operator commands (`kwal ops ...`): status, truncate, retention.

All of them are read-only towards the WAL writer: none opens a `KafkaDriver`
(that would claim a new epoch and fence the running TN). `walscan` is the
shared read-only scan of the WAL and meta topics; `checkpoints` reads the last
checkpoint manifest.
"""
