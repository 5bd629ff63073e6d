"""What the broker holds of a topic: per partition, the log-start offset (ListOffsets
earliest: where DeleteRecords or retention left the log), the end offset, and the bytes.

Bytes: confluent-kafka has no DescribeLogDirs, so they are the sizes of the partition's
segment files (`<log.dirs>/<topic>-<partition>/*.log`) where the broker is local and
its data directory known (the demo's and the tests' Apache Kafka node); None otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec


@dataclass(frozen=True)
class PartitionSize:
    partition: int
    start: int  # log-start offset (ListOffsets earliest)
    end: int  # log-end offset (ListOffsets latest)
    bytes: int | None  # segment bytes on disk (local broker only)


def list_offsets(
    admin: AdminClient, topic: str, partitions: list[int], spec: OffsetSpec, timeout_s: float
) -> dict[int, int]:
    """ListOffsets for `partitions` of `topic` at `spec` (earliest / latest)."""
    futures = admin.list_offsets(
        {TopicPartition(topic, p): spec for p in partitions}, request_timeout=timeout_s
    )
    return {tp.partition: int(f.result(timeout=timeout_s).offset) for tp, f in futures.items()}


def log_start_offsets(
    admin: AdminClient, topic: str, partitions: list[int], timeout_s: float = 10.0
) -> dict[int, int]:
    return list_offsets(admin, topic, partitions, OffsetSpec.earliest(), timeout_s)


def partition_dir_bytes(data_dir: Path, topic: str, partition: int) -> int | None:
    """Bytes of the partition's segment files, or None when its directory is not there."""
    d = data_dir / f"{topic}-{partition}"
    if not d.is_dir():
        return None
    return sum(f.stat().st_size for f in d.glob("*.log") if f.is_file())


def topic_size(
    admin: AdminClient, topic: str, data_dir: Path | None = None, timeout_s: float = 10.0
) -> list[PartitionSize]:
    """Every partition of `topic`: start, end, bytes (module docstring)."""
    md = admin.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if md is None or md.error is not None:
        raise ValueError(f"topic {topic} does not exist")
    parts = sorted(md.partitions)
    starts = log_start_offsets(admin, topic, parts, timeout_s)
    ends = list_offsets(admin, topic, parts, OffsetSpec.latest(), timeout_s)
    return [
        PartitionSize(
            p,
            starts[p],
            ends[p],
            partition_dir_bytes(data_dir, topic, p) if data_dir is not None else None,
        )
        for p in parts
    ]


def broker_data_dir(broker_log: Path) -> Path | None:
    """The data directory of a local Apache Kafka node started by `infra.brokers`
    (`<dir>/broker.log` beside `<dir>/data`), or None (another broker)."""
    d = broker_log.parent / "data"
    return d if (d / "meta.properties").exists() else None
