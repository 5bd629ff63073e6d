"""Producing test records for the Spark source tests."""

from __future__ import annotations

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=10)


def produce(
    bootstrap: str,
    topic: str,
    partitions: int,
    start: int,
    count: int,
    batches: int = 1,
    producer: Producer | None = None,
) -> dict[tuple[int, bytes], bytes]:
    """Records key=k<i>, value=v<i> for i in [start, start+count), partition i % partitions,
    flushed in `batches` separate flushes (several broker batches per partition).
    Returns {(partition, key): value}."""
    p = producer or Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    sent: dict[tuple[int, bytes], bytes] = {}
    per = max(1, count // batches)
    for i in range(start, start + count):
        key, value = f"k{i}".encode(), f"v{i}".encode()
        part = i % partitions
        p.produce(topic, key=key, value=value, partition=part, headers=[("h", str(i).encode())])
        sent[(part, key)] = value
        if (i - start + 1) % per == 0:
            assert p.flush(10) == 0
    assert p.flush(10) == 0
    return sent
