"""`KafkaDriver`: the log driver over a Kafka WAL topic (DESIGN.md "The log store", seed 004).

Opening (recovery), numbered as `__init__` runs it:

1. make sure the WAL and meta topics exist; learn the WAL's partitions;
2. create the driver's ONE idempotent, acks=all producer and its pump thread;
3. claim a new writer epoch on the meta topic (`meta.claim_epoch`); this
   also reads the truncation point and earlier epochs' bases;
4. put an epoch marker on every WAL partition. Markers fence older writers
   (their records after it are zombies) and, through the exact offsets their
   delivery reports give, mark the end of the log for step 5. The high
   watermark is never used: the embedded broker can report it wrongly;
5. read every partition from the offset recorded with the truncation point
   (or its low watermark, whichever is higher) up to its marker, read the
   truncation point again (a fenced writer may have truncated meanwhile), and
   replay (`replay.replay`: head skipped, zombies ignored, tail dropped). Each
   record's format version (`kwal.version`) is checked here, an unknown one
   stops the opening; version 2 entries are decoded when first read;
6. check the WAL topic's retention (`retention.check_retention`): refuse or
   warn per `retention_policy`;
7. record this epoch's base (the recovered last LSN) on the meta topic, then
   accept appends at base + 1, and watch the meta topic for a newer epoch
   (which fails this writer with `FencedError`);
8. start the retention floor (`retention_floor`): a finite retention is held
   above the age and size of the entries not yet checkpointed, so a stalled
   checkpoint never lets Kafka delete them.

End of log: a starting writer never trusts the high watermark (the embedded
broker can report the last batch's base offset + 1). Its own epoch marker, produced
with acks=all to each partition, has an exact offset in its delivery report;
everything durable in that partition before the marker sits at a lower offset,
so "read up to the marker" is the end, with no idle-timeout guess. The meta topic
uses the same trick with the epoch claim record.

Fencing (docs/fencing.md), two layers:

- at the broker (`wal.fence` = transactions, the default where the broker's
  read_committed hides aborted records): step 2's producer is a `TxnBus` with
  `transactional.id` `<prefix>.tn`; its `init_transactions` fences every older
  writer of this WAL before step 3, and every record (WAL, meta, and, through
  channels of the same bus, the TN's results and logtail) is written in a Kafka
  transaction and acknowledged only once that transaction committed. A fenced
  writer's commit is refused by the broker: it can acknowledge nothing more,
  and every reader (read_committed) ignores what it wrote after the fence;
- the epoch rule always (markers + recorded bases, see `replay`); a fenced
  writer also learns it from the meta topic within ~100 ms. Alone (`wal.fence`
  = epoch: Tansu, whose read_committed shows aborted records), it leaves a
  window in which an old writer's acknowledgements can be lost: split-brain
  safety is unavailable there, and the driver logs so at open.

A spent producer: librdkafka can declare the idempotent producer's state
fatal (OUT_OF_ORDER_SEQUENCE_NUMBER after a broker restart that lost records
it had acknowledged). It then refuses every produce, so the pump fails the
writer (`AppendFailedError`) and every pending and later append fails. Those
entries' outcome is unknown (one may be durable and is replayed by the next
open); the owner reopens the log: a new driver, a new epoch. The TN does that
by itself (`tn.service.main`).

`truncate(lsn)`: (1) per partition, find the offset before which every record
holds only LSNs <= lsn (seed 004's rule), (2) record the point and those
offsets on the meta topic (durable), (3) forget entries <= lsn, (4)
DeleteRecords up to those offsets where the broker supports it and the caller
did not turn it off; otherwise truncation is logical only, logged once and
shown in `truncation_mode` / `truncation_note` (for `kwal ops status`). Either
way a starting writer reads each partition from the recorded offset (step 5 of
opening), never from 0.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from infra.capabilities import deletes_records, fences_at_broker
from infra.collector import collector_paused
from infra.config import KwalConfig
from infra.kafka_io import RecordDeleter
from infra.kafka_txn import TxnBus, TxnChannel, is_fenced
from infra.topics import ensure_topics, wal_topics
from schemas.wal_record import RECORD_LATEST, check_version, group_of, payload_at
from tn.logstore.driver import LogClosedError, LogDriver, LogRecord, RecordRun
from tn.logstore.kafka_backend.exceptions import (
    AppendFailedError,
    FencedError,
    KafkaLogError,
    ReplayTimeoutError,
    RetentionUnsafeError,
)
from tn.logstore.kafka_backend.headers import (
    HeaderError,
    decode_headers,
    decode_value,
    epoch_headers,
)
from tn.logstore.kafka_backend.kio import Pump, produce_wait, read_until, reader_conf
from tn.logstore.kafka_backend.meta import MetaLog, MetaWatcher
from tn.logstore.kafka_backend.replay import (
    EntryMap,
    RecordInfo,
    ReplayResult,
    Segment,
    StoredRecord,
    deletable_offsets,
    record_info,
    replay,
)
from tn.logstore.kafka_backend.retention import (
    SafeRetention,
    check_retention,
    read_retention,
    safe_retention,
)
from tn.logstore.kafka_backend.retention_floor import RetentionFloor
from tn.logstore.kafka_backend.writer import GroupWriter, WriterSettings

log = logging.getLogger(__name__)


RetentionPolicy = Literal["refuse", "warn"]


def producer_conf(cfg: KwalConfig) -> dict[str, Any]:
    """The driver's producer: acks=all, idempotent, no linger, bounded delivery, batches
    compressed as `wal.compression` says."""
    return cfg.kafka_client(
        **{
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 0,
            "message.timeout.ms": max(1000, int(cfg.wal.append_timeout_s * 1000)),
            "message.max.bytes": cfg.max_record_bytes,
            "compression.type": cfg.wal.compression_type(),
        }
    )


class KafkaDriver(LogDriver):
    """The Kafka log backend. One per WAL writer process; see the module docstring."""

    def __init__(
        self,
        cfg: KwalConfig,
        *,
        writer_id: str | None = None,
        delete_records: bool | None = None,
        max_in_flight: int = 4,
        retention_policy: RetentionPolicy = "refuse",
        create_topics: bool = True,
        open_timeout_s: float = 30.0,
        record_version: int = RECORD_LATEST,
    ) -> None:
        self.cfg = cfg
        self.topic = cfg.topics.wal
        self.writer_id = writer_id or uuid.uuid4().hex[:16]
        self._timeout = cfg.wal.append_timeout_s
        self._open_timeout = open_timeout_s
        check_version(record_version, "to write")
        self._record_version = record_version
        self._reader_base = cfg.kafka_client()
        self._reader: Consumer | None = None
        self._read_lock = threading.Lock()  # the reader consumer is not shared
        self._truncate_lock = threading.Lock()
        self._closed = False
        self.truncation_mode = "unknown"
        self.truncation_note = ""
        self.retention_warning = ""
        self._retention_read: tuple[float, int | None] | None = None  # (monotonic, ms)
        # 1. topics
        if create_topics:
            ensure_topics(cfg, wal_topics(cfg))
        self._admin = AdminClient(cfg.kafka_client())
        md = self._admin.list_topics(self.topic, timeout=open_timeout_s)
        tmd = md.topics.get(self.topic)
        if tmd is None or tmd.error is not None or not tmd.partitions:
            raise KafkaLogError(f"WAL topic {self.topic} is missing on {cfg.bootstrap}")
        self.partitions = sorted(tmd.partitions)
        # 2. the one producer: a channel of the transactional bus (its init_transactions
        # fences every older writer, module docstring), or a plain idempotent one
        self.bus: TxnBus | None = None
        self._producer: Producer | TxnChannel
        if fences_at_broker(cfg):
            self.bus = TxnBus(producer_conf(cfg), cfg.topics.tn_transactional_id, open_timeout_s)
            self._producer = self.bus.channel()
        else:
            log.warning(
                "split-brain safety is unavailable on the broker at %s (wal.fence=%s; its "
                "read_committed does not hide aborted records, see `kwal doctor`): a TN paused "
                "while another takes its WAL over can acknowledge commits that are then lost",
                cfg.bootstrap,
                cfg.wal.fence,
            )
            self._producer = Producer(producer_conf(cfg))
        self._pump = Pump(self._producer)
        self._pump.start()
        try:
            self._open(delete_records, max_in_flight, retention_policy)
        except BaseException:
            self._pump.stop()
            if self.bus is not None:
                self.bus.close(1.0)
            raise

    # -- opening -------------------------------------------------------------

    def _open(
        self, delete_records: bool | None, max_in_flight: int, policy: RetentionPolicy
    ) -> None:
        cfg = self.cfg
        # 3. claim an epoch
        self._meta = MetaLog(
            self._producer, self._reader_base, cfg.topics.wal_meta, self._open_timeout
        )
        self.epoch, state, claim_offset = self._meta.claim_epoch(self.writer_id)
        log.info(
            "WAL %s: epoch %d claimed by writer %s; reading the log to its end",
            self.topic,
            self.epoch,
            self.writer_id,
        )
        self._truncated = state.truncated
        # 4. markers: fence + end of log
        ends: dict[int, int] = {}
        for p in self.partitions:
            _, off = produce_wait(
                self._producer,
                self.topic,
                b"",
                self._open_timeout,
                headers=epoch_headers(self.epoch, self.writer_id),
                partition=p,
            )
            ends[p] = off
        # 5. read and replay. The truncation point is read again after the WAL: a writer
        # still running (about to be fenced) may have truncated, and physically deleted,
        # after our claim; its point is durable before any deletion, so it is seen here.
        self.replay_start: dict[int, int] = {
            p: state.truncated_offsets.get(p, 0) for p in self.partitions
        }
        with collector_paused():
            stored = list(self._read_wal(ends, self.replay_start))
        self.records_read = len(stored)
        truncated, newest = self._meta.latest_truncation(self.writer_id)
        if newest > self.epoch:
            raise FencedError(f"epoch {newest} was claimed while epoch {self.epoch} was opening")
        self._truncated = max(state.truncated, truncated)
        self._infos: list[RecordInfo] = [record_info(r) for r in stored]
        with collector_paused():
            self.replay_result: ReplayResult = replay(
                stored, self._truncated, state.bases, self.epoch
            )
        self._cache: EntryMap = self.replay_result.entries  # LSN -> payload, by ranges
        self._segments: list[Segment] = self.replay_result.segments
        r = self.replay_result
        log.info(
            "WAL %s epoch %d recovered: truncated %d, last %d, head skipped %d, tail dropped %d, "
            "zombie entries ignored %d",
            self.topic,
            self.epoch,
            r.truncated,
            r.last_lsn,
            r.head_skipped,
            len(r.tail_dropped),
            r.zombies_ignored,
        )
        # 6. retention guard
        self._guard_retention(policy)
        # 7. base, then appends; watch for a newer epoch
        self._meta.record_base(self.epoch, self.writer_id, r.last_lsn)
        self._deletes = deletes_records(cfg, "WAL") if delete_records is None else delete_records
        self.truncation_mode = "physical" if self._deletes else "logical"
        # why truncation is logical, for the note `_truncate` writes: the probe's verdict on
        # the broker (a warning), or the caller's choice (a bench that replays the whole topic)
        self._probed = delete_records is None
        self._deleter = RecordDeleter(self._timeout, retried="at the next truncate")
        self._delete_target: dict[int, int] = {
            p: off for p, off in self.replay_start.items() if off > 0
        }
        self._writer = GroupWriter(
            self._producer,
            self.topic,
            self.partitions,
            self.epoch,
            self.writer_id,
            r.last_lsn,
            WriterSettings(
                window=cfg.wal.window,
                group_max_entries=cfg.wal.group_max_entries,
                group_max_bytes=cfg.wal.group_max_bytes,
                max_in_flight=max_in_flight,
                append_timeout_s=cfg.wal.append_timeout_s,
                kick=self.bus.kick if self.bus is not None else None,
                record_version=self._record_version,
            ),
        )
        if self.bus is not None:
            self.bus.add_source(self._writer.issue_open_group)
        self._pump.add_tick(self._writer.tick)
        self._pump.add_on_fatal(self._on_producer_fatal)
        if self.bus is not None:
            self.bus.add_on_failed(self._on_bus_failed)
        self._watcher = MetaWatcher(
            self._reader_base, cfg.topics.wal_meta, claim_offset + 1, self.epoch, self._on_fenced
        )
        # 8. the retention floor, for the writer's whole life
        self.retention_floor: RetentionFloor | None = None
        if cfg.wal.retention_floor_check_s > 0:
            self.retention_floor = RetentionFloor(
                self._admin,
                self.topic,
                self.needed_retention,
                check_s=cfg.wal.retention_floor_check_s,
                headroom_ms=int(cfg.wal.retention_headroom_s * 1000),
                headroom_bytes=cfg.wal.retention_headroom_bytes,
                timeout_s=self._open_timeout,
            ).start()

    def _read_wal(self, ends: dict[int, int], starts: dict[int, int]) -> list[StoredRecord]:
        out: list[StoredRecord] = []
        reader = read_until(self._reader_base, self.topic, ends, self._open_timeout, starts)
        for msg in reader:
            try:
                header = decode_headers(msg.headers())
                value = msg.value() or b""
                # an unknown version or a garbled value stops the opening (never skipped)
                where = f"{self.topic}/{msg.partition()}@{msg.offset()}"
                # a version 2 or 3 record's LSNs all share its one LazyGroup (no object
                # per entry for the collector to walk): `_read` hands out each one's own
                payloads = decode_value(header, value, where, shared=True)
            except HeaderError as e:
                log.warning(
                    "WAL %s: skipping foreign record at %s/%s: %s",
                    self.topic,
                    msg.partition(),
                    msg.offset(),
                    e,
                )
                continue
            _, ts = msg.timestamp()
            out.append(
                StoredRecord(
                    int(msg.partition() or 0),
                    int(msg.offset() or 0),
                    header,
                    payloads,
                    int(ts),
                    len(msg.value() or b""),
                )
            )
        return out

    def _guard_retention(self, policy: RetentionPolicy) -> None:
        try:
            retention = read_retention(self._admin, self.topic, self._open_timeout)
        except KafkaException as e:
            self.retention_warning = f"cannot read retention of WAL topic {self.topic}: {e}"
            log.warning("%s", self.retention_warning)
            return
        safe = safe_retention(self._infos, self._truncated)
        try:
            check = check_retention(self.topic, retention, safe)
        except RetentionUnsafeError as e:
            if policy == "refuse":
                raise
            self.retention_warning = str(e)
            log.error("UNSAFE WAL RETENTION: %s", e)
            return
        if check.warning:
            self.retention_warning = check.warning
            log.warning("WAL RETENTION: %s", check.warning)

    def _on_producer_fatal(self, e: KafkaException) -> None:
        """librdkafka gives up on an idempotent producer it cannot keep in sequence (after a
        broker restart that lost records, say): nothing more can be produced, so the writer
        fails. Reopening the log (a new driver: a new epoch, a new producer) is the way on."""
        self._writer.fail(
            AppendFailedError(
                f"the WAL producer of writer {self.writer_id} (epoch {self.epoch}) on "
                f"{self.topic} hit a fatal error and can send nothing more: {e}; reopen the log"
            )
        )

    def _on_bus_failed(self, err: KafkaError) -> None:
        """The transactional producer failed: fenced at the broker by a newer TN, or any
        other fatal error (then the log is reopened, like `_on_producer_fatal`)."""
        assert self.bus is not None
        if is_fenced(err):
            self._writer.fail(
                FencedError(
                    f"writer {self.writer_id} (epoch {self.epoch}) on {self.topic} was fenced at "
                    f"the broker: a newer TN initialised transactional.id "
                    f"{self.bus.transactional_id}; nothing it writes is committed any more ({err})"
                )
            )
            return
        self._on_producer_fatal(KafkaException(err))

    def _on_fenced(self, newer: int) -> None:
        self._writer.fail(
            FencedError(
                f"writer {self.writer_id} (epoch {self.epoch}) was fenced by epoch {newer} on "
                f"{self.topic}; its later records are never replayed"
            )
        )

    # -- the driver interface --------------------------------------------------

    def append(self, lsn: int, payload: bytes) -> Future[int]:
        return self._writer.append(lsn, payload)

    def last_lsn(self) -> int:
        return self._writer.next_lsn - 1

    def acked_lsn(self) -> int:
        """The contiguous acknowledged LSN."""
        return self._writer.acked

    def identity(self) -> str:
        return f"kafka:{self.topic}"

    def truncated(self) -> int:
        return self._truncated

    def failure(self) -> BaseException | None:
        """Why appends fail (fenced, broker lost), or None."""
        return self._writer.failure

    def read(self, from_lsn: int, max_bytes: int) -> tuple[list[LogRecord], int]:
        with self._read_lock:
            return self._read(from_lsn, max_bytes)

    def _read(self, from_lsn: int, max_bytes: int) -> tuple[list[LogRecord], int]:
        start = max(from_lsn, self._truncated + 1)
        end = self._writer.acked
        out: list[LogRecord] = []
        size = 0
        lsn = start
        fetched: dict[int, bytes] = {}
        while lsn <= end:
            payload = self._cache.get(lsn)
            if payload is None:
                payload = fetched.get(lsn)
            if payload is None:
                fetched = self._fetch(lsn)
                payload = fetched.get(lsn)
                if payload is None:
                    raise KafkaLogError(f"WAL {self.topic}: LSN {lsn} is not in the log map")
            if out and size + len(payload) > max_bytes:
                break
            out.append(LogRecord(lsn, payload_at(payload, lsn)))
            size += len(payload)
            lsn += 1
        return out, lsn

    def runs(self, from_lsn: int, max_bytes: int = 4 << 20) -> Iterator[LogRecord | RecordRun]:
        """The entries recovered at opening a record at a time: the entries of a version 2
        or 3 record as one `RecordRun` (undecoded until its group is asked for), a version
        1 record's one by one; what follows (appended since) as `read` gives it."""
        lsn = max(from_lsn, self._truncated + 1)
        end = self._writer.acked
        for seg in list(self._segments):
            if seg.last < lsn:
                continue
            hi = min(seg.last, end)
            first = self._cache.get(lsn) if seg.first <= lsn <= hi else None
            if first is None:
                break  # not where the run continues: the generic path from here
            group = group_of(first)
            if group is not None:
                yield RecordRun(lsn, hi, group)
            else:
                for at in range(lsn, hi + 1):
                    yield LogRecord(at, payload_at(self._cache[at], at))
            lsn = hi + 1
        yield from LogDriver.runs(self, lsn, max_bytes)

    def _segment_for(self, lsn: int) -> Segment | None:
        with self._writer.lock():
            for segs in (self._segments, self._writer.segments):
                i = bisect.bisect_right(segs, lsn, key=lambda s: s.first) - 1
                if i >= 0 and segs[i].first <= lsn <= segs[i].last:
                    return segs[i]
        return None

    def _fetch(self, lsn: int) -> dict[int, bytes]:
        """Read the record holding `lsn` back from Kafka; its entries by LSN."""
        seg = self._segment_for(lsn)
        if seg is None:
            return {}
        if self._reader is None:
            self._reader = Consumer(reader_conf(self._reader_base))
        self._reader.assign([TopicPartition(self.topic, seg.partition, seg.offset)])
        deadline = time.monotonic() + self._open_timeout
        while time.monotonic() < deadline:
            msg = self._reader.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            if msg.partition() != seg.partition or msg.offset() != seg.offset:
                continue
            header = decode_headers(msg.headers())
            where = f"{self.topic}/{seg.partition}@{seg.offset}"
            payloads = decode_value(header, msg.value() or b"", where, shared=True)
            return {header.first + i: p for i, p in enumerate(payloads)}
        raise ReplayTimeoutError(
            f"cannot read WAL record {seg.partition}/{seg.offset} of {self.topic}"
        )

    def truncate(self, lsn: int) -> None:
        with self._truncate_lock:
            self._truncate(lsn)

    def _truncate(self, lsn: int) -> None:
        if lsn <= self._truncated:
            return
        acked = self._writer.acked
        if lsn > acked:
            raise ValueError(f"cannot truncate to {lsn}: only {acked} is acknowledged")
        # 1. the disposable prefix per partition (it only grows: merged with the last one)
        with self._writer.lock():
            infos = self._infos + list(self._writer.records)
        plan = self.physical_truncation_plan(infos, lsn)
        target = dict(self._delete_target)
        for p, off in plan.items():
            target[p] = max(target.get(p, 0), off)
        # 2. durable logical point, with the offsets a starting writer reads from
        self._meta.record_truncation(lsn, target)
        # 3. forget
        self._truncated = lsn
        self._cache.drop_through(lsn)
        with self._writer.lock():
            self._delete_target = target
            self._segments = [s for s in self._segments if s.last > lsn]
            self._writer.segments[:] = [s for s in self._writer.segments if s.last > lsn]
            self._infos = [i for i in self._infos if i.offset >= target.get(i.partition, 0)]
            self._writer.records[:] = [
                i for i in self._writer.records if i.offset >= target.get(i.partition, 0)
            ]
        # 4. physical, where the broker can
        if not self._deletes:
            if not self.truncation_note:
                because = (
                    f"the broker at {self.cfg.bootstrap} lacks DeleteRecords" if self._probed
                    else "DeleteRecords is turned off for this WAL (delete_records=False)"
                )
                self.truncation_note = (
                    f"{because}: WAL truncation is logical only (the truncation "
                    "point is on the meta topic; records stay, and a starting writer reads from "
                    "the recorded offsets)"
                )
                log.log(logging.WARNING if self._probed else logging.INFO, "%s", self.truncation_note)
            return
        self._deleter.delete(self._admin, {(self.topic, p): off for p, off in target.items()})

    @staticmethod
    def physical_truncation_plan(infos: list[RecordInfo], lsn: int) -> dict[int, int]:
        """Per partition, the offset DeleteRecords may delete before (seed 004's rule)."""
        return deletable_offsets(infos, lsn)

    def needed_retention(self) -> SafeRetention:
        """The age and bytes of what retention must keep now (no margin): every record
        holding an entry above the truncation point."""
        return safe_retention(self.records_map(), self._truncated, margin=1.0)

    def records_map(self) -> list[RecordInfo]:
        """Every record this driver knows of: (partition, offset) -> max LSN, time, size."""
        with self._writer.lock():
            return self._infos + list(self._writer.records)

    def retention_ms(self, max_age_s: float = 30.0) -> int | None:
        """The WAL topic's retention.ms (-1: unlimited; None: the broker cannot say), read
        again at most every `max_age_s` (an operator may change it while the TN runs)."""
        now = time.monotonic()
        cached = self._retention_read
        if cached is not None and now - cached[0] < max_age_s:
            return cached[1]
        try:
            ms: int | None = read_retention(self._admin, self.topic, self._open_timeout).ms
        except KafkaException:
            ms = None
        self._retention_read = (now, ms)
        return ms

    def status(self) -> dict[str, object]:
        """What `kwal ops status` shows about this WAL writer."""
        failure = self._writer.failure
        return {
            "topic": self.topic,
            "partitions": len(self.partitions),
            "epoch": self.epoch,
            "writer_id": self.writer_id,
            "last_lsn": self.last_lsn(),
            "acked_lsn": self._writer.acked,
            "truncated": self._truncated,
            "truncation_mode": self.truncation_mode,
            "truncation_note": self.truncation_note,
            "retention_warning": self.retention_warning,
            "retention_floor": (
                self.retention_floor.status() if self.retention_floor is not None else None
            ),
            "failure": str(failure) if failure is not None else "",
        }

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.retention_floor is not None:
            self.retention_floor.stop()
        self._writer.close(self._timeout)
        self._watcher.stop()
        self._pump.stop()
        self._producer.flush(min(self._timeout, 5.0))
        if self.bus is not None:
            self.bus.close(min(self._timeout, 5.0))
        with self._read_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None


__all__ = ["KafkaDriver", "LogClosedError", "producer_conf"]
