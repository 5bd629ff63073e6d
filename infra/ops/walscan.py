"""A READ-ONLY scan of the WAL topic and its meta topic, for operators.

It never claims an epoch, never produces to the WAL and never opens a
`KafkaDriver` (opening one would fence the running writer). What it reports:

- per WAL partition: low watermark, the high watermark the broker reports, the
  end actually found, and the LSN ranges its records hold;
- from the meta topic: the logical truncation point, the highest epoch and its
  writer, the recorded bases, and the TN's own status record if it publishes one
  (`STATUS_KEY`: `status_record`, published by `StatusPublisher`);
- the log a new writer would recover (`replay.replay` run on headers only, as
  epoch max + 1): its contiguous end, the dropped tail, zombie entries.

End of a partition, without producing a marker: read from the start (or from
a given offset) past the reported high watermark until nothing new arrives for
`idle_s` (the embedded broker can report the base offset of the last batch + 1
as the high watermark, so the high watermark alone is not the end). A record
that lands after the scan is simply not in it: the result is a snapshot, and
`end_method` says how the end was found.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from infra.config import KwalConfig
from tn.logstore.kafka_backend.exceptions import KafkaLogError
from tn.logstore.kafka_backend.headers import KIND_EPOCH, HeaderError, decode_headers
from tn.logstore.kafka_backend.meta import MetaState
from tn.logstore.kafka_backend.replay import RecordInfo, StoredRecord, record_info, replay

STATUS_KEY = b"status"  # meta-topic key of the TN's periodic status record (ignored by MetaState)
IDLE_S = 0.5
END_METHOD = f"read past the reported high watermark until idle for {IDLE_S:.1f}s"


class OpsError(RuntimeError):
    """An ops command cannot do its work; the message is the one line to print."""


class KafkaUnreachableError(OpsError):
    pass


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


# -- the TN's status record ----------------------------------------------------------


def status_record(driver_status: Mapping[str, Any], now_ms: int | None = None) -> bytes:
    """The value a TN may publish under `STATUS_KEY` on the meta topic (periodically, e.g.
    with its heartbeat) so that `kwal ops status` can show the in-flight window:
    `KafkaDriver.status()` plus the window size and a timestamp."""
    doc = dict(driver_status)
    doc["ts_ms"] = int(time.time() * 1000) if now_ms is None else now_ms
    return json.dumps(doc, sort_keys=True, default=str).encode()


class StatusPublisher:
    """Publishes the TN's status record (`status_record(status_fn())`) on the meta topic every
    `interval_s`, on a daemon thread with a producer of its own (not idempotent: it must not
    slow the WAL's idempotent producer). For the TN:

        pub = StatusPublisher(cfg, lambda: {**driver.status(), "window": cfg.wal.window}).start()
        ...
        pub.stop()

    Failures are counted, never raised: status is for operators only. Keep the interval in
    seconds: a writer reads the whole meta topic when it opens.
    """

    def __init__(
        self, cfg: KwalConfig, status_fn: Callable[[], Mapping[str, Any]], interval_s: float = 5.0
    ) -> None:
        import threading

        from confluent_kafka import Producer

        self._cfg = cfg
        self._status_fn = status_fn
        self._interval_s = interval_s
        self._producer = Producer(cfg.kafka_client(**{"acks": "all", "linger.ms": 0}))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kwal-tn-status", daemon=True)
        self.failures = 0

    def start(self) -> StatusPublisher:
        self._thread.start()
        return self

    def publish(self) -> None:
        try:
            self._producer.produce(
                self._cfg.topics.wal_meta,
                status_record(self._status_fn()),
                key=STATUS_KEY,
                partition=0,
            )
            self._producer.poll(0)
        except Exception:  # noqa: BLE001 - status is best effort
            self.failures += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.publish()
            self._stop.wait(self._interval_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._producer.flush(timeout_s)


# -- the scan --------------------------------------------------------------------------


@dataclass
class PartitionScan:
    partition: int
    low: int
    high_reported: int
    end: int
    records: int = 0  # kwal records (entries + markers)
    markers: int = 0
    foreign: int = 0  # records without kwal headers
    bytes: int = 0
    lsn_ranges: list[list[int]] = field(default_factory=list)  # [[first, last], ...] merged

    @property
    def first_lsn(self) -> int:
        return self.lsn_ranges[0][0] if self.lsn_ranges else 0

    @property
    def last_lsn(self) -> int:
        return max((r[1] for r in self.lsn_ranges), default=0)


@dataclass
class WalScan:
    topic: str
    meta_topic: str
    exists: bool
    partitions: list[PartitionScan] = field(default_factory=list)
    truncated: int = 0
    epoch: int = 0  # highest claimed
    writer: str = ""  # its winner
    bases: dict[int, int] = field(default_factory=dict)
    log_end: int = 0  # the contiguous end a new writer would recover (>= truncated)
    tail_dropped: int = 0
    zombies_ignored: int = 0
    max_acked: int = 0  # highest `kwal.acked` header among valid records
    replay_error: str = ""
    tn_status: dict[str, Any] | None = None
    end_method: str = END_METHOD
    infos: list[RecordInfo] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("infos")
        d["bases"] = {str(k): v for k, v in self.bases.items()}
        for p, ps in zip(d["partitions"], self.partitions, strict=True):
            p["first_lsn"] = ps.first_lsn
            p["last_lsn"] = ps.last_lsn
        return d


def read_meta(cfg: KwalConfig, timeout_s: float) -> tuple[MetaState, dict[str, Any] | None]:
    """The meta topic's state (truncation point, epochs, bases) and the TN's last status record;
    an empty state when the meta topic does not exist."""
    state = MetaState()
    status: list[dict[str, Any]] = []

    def on_msg(msg: Message) -> None:
        key = msg.key() or b""
        value = msg.value()
        state.apply(key, value)
        if key == STATUS_KEY and value:
            try:
                status.append(json.loads(value))
            except ValueError:
                pass

    admin = AdminClient(cfg.kafka_client())
    parts = topic_partitions(admin, cfg.topics.wal_meta, timeout_s)
    if parts is None:
        return state, None
    read_to_end(cfg, cfg.topics.wal_meta, [0], on_msg, timeout_s)
    return state, (status[-1] if status else None)


def _merge(ranges: list[list[int]], first: int, last: int) -> None:
    if ranges and ranges[-1][1] + 1 == first:
        ranges[-1][1] = last
    else:
        ranges.append([first, last])


def scan_wal(cfg: KwalConfig, timeout_s: float = 30.0) -> WalScan:
    """The read-only scan (module docstring). `OpsError` on a bounded-wait failure."""
    topic = cfg.topics.wal
    admin = AdminClient(cfg.kafka_client())
    try:
        parts = topic_partitions(admin, topic, timeout_s)
        state, status = read_meta(cfg, timeout_s)
    except KafkaException as e:
        raise OpsError(f"cannot read the WAL meta topic {cfg.topics.wal_meta}: {e}") from e
    scan = WalScan(topic=topic, meta_topic=cfg.topics.wal_meta, exists=parts is not None)
    scan.truncated = state.truncated
    scan.epoch = state.max_epoch
    scan.writer = state.claims.get(state.max_epoch, "")
    scan.bases = dict(state.bases)
    scan.tn_status = status
    scan.log_end = state.truncated
    if parts is None:
        return scan
    stored: list[StoredRecord] = []
    by_part: dict[int, PartitionScan] = {}

    def on_msg(msg: Message) -> None:
        p = int(msg.partition() or 0)
        ps = by_part[p]
        size = len(msg.value() or b"")
        ps.bytes += size
        try:
            header = decode_headers(msg.headers())
        except HeaderError:
            ps.foreign += 1
            return
        ps.records += 1
        if header.kind == KIND_EPOCH:
            ps.markers += 1
        elif header.count > 0:
            _merge(ps.lsn_ranges, header.first, header.last)
        _, ts = msg.timestamp()
        # headers only: replay needs one (empty) payload per entry, never the bytes
        stored.append(
            StoredRecord(p, int(msg.offset() or 0), header, (b"",) * header.count, int(ts), size)
        )

    for p in parts:
        by_part[p] = PartitionScan(p, 0, 0, 0)
    try:
        ends = read_to_end(cfg, topic, parts, on_msg, timeout_s, start=state.truncated_offsets)
    except KafkaException as e:
        raise OpsError(f"cannot read the WAL topic {topic}: {e}") from e
    for p, pe in ends.items():
        ps = by_part[p]
        ps.low, ps.high_reported, ps.end = pe.low, pe.high_reported, pe.end
    scan.partitions = [by_part[p] for p in parts]
    scan.infos = [record_info(r) for r in stored]
    newest = max([state.max_epoch, *(r.header.epoch for r in stored)], default=0)
    try:
        result = replay(stored, state.truncated, state.bases, newest + 1)
    except KafkaLogError as e:
        scan.replay_error = str(e)
    else:
        scan.log_end = result.last_lsn
        scan.tail_dropped = len(result.tail_dropped)
        scan.zombies_ignored = result.zombies_ignored
        scan.max_acked = result.max_acked
    return scan
