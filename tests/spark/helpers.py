"""Producing test records for the Spark source tests; comparing a Spark CN's rows with a
TN's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

if TYPE_CHECKING:
    from tests.logtail.conftest import Tn


def spark_rows(df: Any) -> list[dict[str, Any]]:
    """A Spark CN read's rows as dicts, sorted by the tests' primary key `id`."""
    return sorted(df.toArrow().to_pylist(), key=lambda r: r["id"])


def tn_rows(tn: Tn, name: str, ts: int) -> list[dict[str, Any]]:
    """The TN's rows of db.`name` as of `ts`, as `spark_rows` gives a CN's."""
    return sorted(tn.engine.read("db", name, ts).to_pylist(), key=lambda r: r["id"])


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
