"""infra.kafka_txn against the session's broker: how a fenced transactional producer's
errors are classified."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException, Producer

from infra.config import KwalConfig
from infra.kafka_txn import fatal_cause, is_fenced
from infra.topics import ensure_topics


def _txn_producer(cfg: KwalConfig, tid: str) -> Producer:
    p = Producer(cfg.kafka_client(**{"transactional.id": tid, "acks": "all"}))
    p.init_transactions(30)
    return p


def test_a_fenced_producers_bare_fatal_error_is_traced_to_the_fence(kwal_config: KwalConfig) -> None:
    """Once librdkafka has declared a fenced producer fatal, `produce` raises only
    `_FATAL` ("Unable to produce message"), not flagged fatal. `fatal_cause` finds the
    fence behind it, which decides whether a TN may reopen its log (a fenced one must
    not: it would fence the TN that took over)."""
    cfg = kwal_config
    ensure_topics(cfg)
    topic = cfg.topics.results
    tid = f"{cfg.topics.prefix}.fatal-cause"
    old = _txn_producer(cfg, tid)
    old.begin_transaction()
    old.produce(topic, b"before the fence")
    old.commit_transaction(30)
    newer = _txn_producer(cfg, tid)  # the fence
    try:
        old.begin_transaction()
        old.produce(topic, b"after the fence")
        try:
            old.flush(30)  # AddPartitionsToTxn meets the fence: the producer turns fatal
        except KafkaException as e:
            assert is_fenced(e.args[0]), e
        try:
            old.produce(topic, b"once fatal")
        except KafkaException as e:
            bare = e.args[0]
        else:
            raise AssertionError("a fatal producer took a record")
        assert bare.code() == KafkaError._FATAL and not is_fenced(bare), bare
        cause = fatal_cause(old, bare, 10)
        assert is_fenced(cause) and cause.fatal(), cause
        # any other error is left as it is
        other = KafkaError(KafkaError._TIMED_OUT, "slow")
        assert fatal_cause(old, other, 10) is other
    finally:
        newer.flush(10)
