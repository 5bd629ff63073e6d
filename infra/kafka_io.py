"""Small confluent-kafka idioms shared by kwal's consumers."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer


def poll_batch(consumer: Consumer, max_messages: int, timeout: float) -> list[Any]:
    """Wait up to `timeout` for the first message, then take what is already
    fetched without waiting (`consume(n, timeout)` would wait the whole timeout
    for n messages)."""
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *consumer.consume(max_messages - 1, timeout=0)]
