"""Small confluent-kafka idioms shared by kwal's clients."""

from __future__ import annotations

import logging
import os
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)

# How long the broker may hold a fetch when no data is there, for every reader a
# latency figure depends on: the TN's requests reader and the clients' results
# reader (every commit crosses those two fetches), and the CN's logtail reader
# (commit-to-visible). Measured on the embedded broker: while a fetch is held,
# produce acknowledgements wait too (one produce->consume hop: ~17 ms at 50,
# ~2-3 ms at 10, with a worse p99 at 10; raw produce-to-consume at 1k records/s
# p50 16 ms at 50 and 9 ms at 25). 25 is the compromise; override with
# KWAL_FETCH_WAIT_MS.
FETCH_WAIT_MS = int(os.environ.get("KWAL_FETCH_WAIT_MS", "25"))

# The same for a reader of a topic that is idle nearly always (the ops topic's commands and
# replies, the WAL meta topic's fence watch). Apache Kafka answers a held fetch as soon
# as a record arrives, so this bounds only how often an idle reader asks again: at 25-75 ms
# those two readers alone sent the broker ~30 empty fetches a second, beside a few hundred
# real requests at 2,000 commits/s (docs/perf-commit.md, "2026-11-27 (8)"). 500 ms is
# librdkafka's own default.
IDLE_FETCH_WAIT_MS = 500


def poll_batch(consumer: Consumer, max_messages: int, timeout: float) -> list[Any]:
    """Wait up to `timeout` for the first message, then take what is already
    fetched without waiting (`consume(n, timeout)` would wait the whole timeout
    for n messages)."""
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *consumer.consume(max_messages - 1, timeout=0)]


def delete_records(
    admin: AdminClient, todo: list[TopicPartition], timeout_s: float
) -> tuple[list[TopicPartition], list[tuple[TopicPartition, KafkaException]]]:
    """DeleteRecords: every record below each partition's given offset, waiting up to
    `timeout_s` for each; returns (deleted, failed with their error)."""
    futures = admin.delete_records(todo, request_timeout=timeout_s, operation_timeout=timeout_s)
    done: list[TopicPartition] = []
    failed: list[tuple[TopicPartition, KafkaException]] = []
    for tp, fut in futures.items():
        try:
            fut.result(timeout=timeout_s)
            done.append(tp)
        except KafkaException as e:
            failed.append((tp, e))
    return done, failed


class RecordDeleter:
    """DeleteRecords below offsets that only grow (a truncated WAL, truncated logtail topics).

    It remembers where each (topic, partition) was already deleted and asks only
    for what moved past it; a failed deletion is logged and asked again at the
    next call (`retried` says when that is, for the log)."""

    def __init__(self, timeout_s: float, retried: str) -> None:
        self.timeout_s = timeout_s
        self.retried = retried
        self.deleted_before: dict[tuple[str, int], int] = {}

    def delete(self, admin: AdminClient, targets: dict[tuple[str, int], int]) -> None:
        todo = [
            TopicPartition(topic, partition, offset)
            for (topic, partition), offset in sorted(targets.items())
            if offset > self.deleted_before.get((topic, partition), 0)
        ]
        if not todo:
            return
        done, failed = delete_records(admin, todo, self.timeout_s)
        for tp in done:
            self.deleted_before[(tp.topic, tp.partition)] = tp.offset
        for tp, e in failed:
            log.warning(
                "DeleteRecords %s/%s before %s failed (retried %s): %s",
                tp.topic,
                tp.partition,
                tp.offset,
                self.retried,
                e,
            )
