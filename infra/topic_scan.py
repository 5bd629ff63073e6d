"""Read a topic's partitions to their real end, read-only (the ops commands' scans).

End of a partition, without producing anything: read from the start (or from a
given offset) past the reported high watermark until nothing new arrives for
`idle_s` (the embedded broker can report the base offset of the last batch + 1
as the high watermark, so the high watermark alone is not the end). A record
that lands after the scan is simply not in it: the result is a snapshot, and
`END_METHOD` says how the end was found.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from infra.config import KwalConfig
from infra.exceptions import KafkaUnreachableError, OpsError

IDLE_S = 0.5
END_METHOD = f"read past the reported high watermark until idle for {IDLE_S:.1f}s"


def admin_for(cfg: KwalConfig, timeout_s: float) -> AdminClient:
    """An AdminClient, after checking (bounded) that a broker answers."""
    admin = AdminClient(cfg.kafka_client(**{"socket.timeout.ms": int(max(timeout_s, 1.0) * 1000)}))
    try:
        md = admin.list_topics(timeout=timeout_s)
        if not md.brokers:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
    except KafkaException as e:
        raise KafkaUnreachableError(
            f"Kafka is unreachable at {cfg.bootstrap} (no answer within {timeout_s:.0f}s: {e})"
        ) from e
    return admin


def topic_partitions(admin: AdminClient, topic: str, timeout_s: float) -> list[int] | None:
    """The topic's partitions, or None when it does not exist. (All topics are listed: a
    Metadata request naming a topic can auto-create it on some brokers.)"""
    md = admin.list_topics(timeout=timeout_s)
    tmd = md.topics.get(topic)
    if tmd is None or tmd.error is not None or not tmd.partitions:
        return None
    return sorted(tmd.partitions)


def list_topics(admin: AdminClient, timeout_s: float) -> list[str]:
    return sorted(admin.list_topics(timeout=timeout_s).topics)


@dataclass
class PartitionEnd:
    low: int
    high_reported: int
    end: int  # one past the last offset seen (>= high_reported)


def read_to_end(
    cfg: KwalConfig,
    topic: str,
    partitions: list[int],
    on_msg: Callable[[Message], None],
    timeout_s: float,
    start: Mapping[int, int] | None = None,
    idle_s: float = IDLE_S,
    tail_only: bool = False,
) -> dict[int, PartitionEnd]:
    """Read `partitions` of `topic` from their low watermark (or `start[p]`, clamped to it;
    or, `tail_only`, from the reported high watermark - 1, to find the end cheaply) to the
    end found as the module docstring says; call `on_msg` for each record. Bounded by
    `timeout_s` (`OpsError` when the reported high watermark is not reached in time)."""
    conf = cfg.kafka_client(
        **{
            "group.id": f"kwal-ops-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "fetch.wait.max.ms": 75,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            # a fenced TN's records are aborted: never counted (docs/fencing.md)
            "isolation.level": "read_committed",
        }
    )
    consumer = Consumer(conf)
    deadline = time.monotonic() + timeout_s
    try:
        ends: dict[int, PartitionEnd] = {}
        assign: list[TopicPartition] = []
        for p in partitions:
            left = max(0.5, deadline - time.monotonic())
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=left)
            first = max(low, high - 1) if tail_only else max(low, (start or {}).get(p, low))
            ends[p] = PartitionEnd(low, high, max(first, low))
            assign.append(TopicPartition(topic, p, first))
        consumer.assign(assign)
        waiting = {p for p, e in ends.items() if e.high_reported > e.end}
        last_new = time.monotonic()
        while True:
            now = time.monotonic()
            if now > deadline:
                if waiting:
                    raise OpsError(
                        f"reading {topic} did not reach the high watermark of partitions "
                        f"{sorted(waiting)} within {timeout_s:.0f}s"
                    )
                break
            if not waiting and now - last_new >= idle_s:
                break
            for msg in consumer.consume(500, 0.1):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise OpsError(f"reading {topic}: {err}")
                p = int(msg.partition() or 0)
                off = int(msg.offset() or 0)
                pe = ends.get(p)
                if pe is None or off < pe.end:
                    continue
                pe.end = off + 1
                last_new = time.monotonic()
                if pe.end >= pe.high_reported:
                    waiting.discard(p)
                on_msg(msg)
            _past_control_records(consumer, topic, ends, waiting)
        return ends
    finally:
        consumer.close()


def _past_control_records(
    consumer: Consumer, topic: str, ends: dict[int, PartitionEnd], waiting: set[int]
) -> None:
    """Transaction markers and aborted records occupy offsets no message shows: the
    consumer's position moves past them, so it is the end read so far."""
    if not waiting:
        return
    for tp in consumer.position([TopicPartition(topic, p) for p in sorted(waiting)]):
        pe = ends.get(tp.partition)
        if pe is not None and tp.offset is not None and tp.offset > pe.end:
            pe.end = tp.offset
            if pe.end >= pe.high_reported:
                waiting.discard(tp.partition)
