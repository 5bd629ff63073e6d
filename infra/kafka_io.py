"""Small confluent-kafka idioms shared by kwal's clients."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient


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
