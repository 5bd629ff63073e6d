"""Push the logtail to Kafka: one topic per table, DDL on the catalog topic (seed 001, "推送").

1. The engine calls `on_commit(entry)` for each committed transaction, in LSN
   order, and `on_heartbeat(ts)` for each heartbeat (an empty transaction that
   only consumes a timestamp, ordered in the same commit queue). Both only
   enqueue: the commit path never waits for Kafka.
2. The publisher thread takes everything queued, collects the records of each
   entry (concurrently with the next WAL writes), creates a table's topic when
   its CREATE TABLE passes (before anything is produced to it), and produces
   with one idempotent producer, so each topic holds its records in LSN order.
3. A heartbeat at ts goes to the catalog topic and to every live table's
   topic that got no record since the previous heartbeat: a CN then knows
   that every change with commit ts <= ts was sent.
4. Delivery failures are kept (`errors`) and reported by `flush`; the producer
   retries by itself (idempotence keeps order and avoids duplicates). A record
   acknowledged without an offset is produced again: its delivery callback
   only queues it (`_delivered`), and whoever polls the producer next produces
   it (`_produce_again`): the publisher thread after its poll, `flush` and
   `close` before they report everything delivered. Never from inside the
   callback, where a full producer queue could only wait on the very thread
   that serves the reports which would empty it.
5. `offsets()` is, per topic, one past the highest offset acknowledged so far.
   A checkpoint reads it BEFORE it picks t1 (tn.checkpoint.runner, step 1):
   every record acknowledged by then belongs to a transaction committed
   before t1, and every later record lands at or above it (one producer, in-
   order acknowledgements per partition; a record produced again gets a new,
   higher offset). So the manifest's offsets are where a CN bootstrapping from
   that checkpoint starts following (consumers.core.cn), and all below them
   may be truncated once a later checkpoint exists.
6. Keys: a heartbeat's is `HEARTBEAT_KEY`, every other record's is unique
   (`<publisher id>:<n>`). The catalog and table topics are compacted
   (infra.topics): the log cleaner keeps only a topic's newest heartbeat, so
   heartbeats stay out of the topics' long-term retention while readers still
   see one after the last change. A record produced again keeps its key, so
   both copies stay (CNs drop the repeat by LSN, as before).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from itertools import count
from typing import Any

from confluent_kafka import KafkaError, Producer

from infra.config import KwalConfig
from infra.kafka_txn import TxnChannel
from infra.queues import drain
from infra.topics import ensure_topics, logtail_topic
from schemas.logtail import (
    Catalog,
    CatalogOp,
    Heartbeat,
    LogtailRecord,
    encode_logtail,
    record_key,
)
from schemas.wal import WalEntry
from tn.catalog.nodes import SYSTEM_DB
from tn.logtail.collector import CatalogView, collect

log = logging.getLogger(__name__)

_STOP = object()


class LogtailPublisher:
    def __init__(
        self,
        cfg: KwalConfig,
        view: CatalogView,
        live_tables: list[str] | None = None,
        producer: TxnChannel | None = None,
    ) -> None:
        self.cfg = cfg
        self.view = view
        # SimpleQueue: put on the commit path is one C call, no Condition to notify
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # A channel of the WAL's transactional bus where the TN fences at the broker
        # (docs/fencing.md): a replaced TN's logtail is then aborted, never applied by a CN.
        self._producer: Producer | TxnChannel = producer if producer is not None else Producer(
            cfg.kafka_client(
                **{
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": cfg.tn.logtail_linger_ms,
                    "compression.type": "lz4",
                    "message.max.bytes": cfg.max_record_bytes,
                }
            )
        )
        # the TN's own tables are never pushed (tn.logtail.collector): no topic, no heartbeat
        self._live: set[str] = {n for n in live_tables or [] if not n.startswith(f"{SYSTEM_DB}.")}
        self._since_heartbeat: set[str] = set()
        self._topics_ready: set[str] = set()
        self.errors: list[str] = []
        self.published_lsn = 0
        self.published_ts = 0
        self._lag_peak = 0  # the most committed entries waiting to be published at once
        self._thread = threading.Thread(target=self._run, name="kwal-logtail", daemon=True)
        self._idle = threading.Event()
        self._idle.set()
        # (topic, key, value) of records acknowledged without an offset, to produce again
        self._again: queue.SimpleQueue[tuple[str, bytes, bytes]] = queue.SimpleQueue()
        # keys: `<this publisher>:<n>`, unique on every topic; heartbeats share one (step 6)
        self._key_prefix = uuid.uuid4().hex[:16]
        self._seq = count()
        self._ends: dict[str, int] = {}  # topic -> 1 + highest acknowledged offset
        ensure_topics(cfg, [])  # fail early when Kafka is not reachable
        for name in self._live:
            self._ensure_table_topic(name)

    # -- engine hooks (called on the commit path: enqueue only) -----------------

    def on_commit(self, entry: WalEntry) -> None:
        self._idle.clear()
        self._queue.put(entry)
        self._lag_peak = max(self._lag_peak, entry.lsn - self.published_lsn)

    def lag_peak(self) -> int:
        """The most committed entries queued but not yet published at once since the last
        call (a metrics sample): this entry's LSN minus the last published one, at commit."""
        peak, self._lag_peak = self._lag_peak, 0
        return peak

    def on_heartbeat(self, ts: int) -> None:
        self._idle.clear()
        self._queue.put(ts)

    def publish_records(self, records: list[LogtailRecord]) -> None:
        """Queue ready-made table records (tn.checkpoint: BlockMeta after a flush, then
        Checkpoint(manifest) once the manifest is written), in order with commits. The
        TN's own tables have no topic (`tn.logtail.collector`): their records are left
        out. (On the fenced bus a record to a topic that does not exist is never
        acknowledged, and the whole Kafka transaction holding it, the WAL's records with
        it, times out.)"""
        ours = [r for r in records if r.database != SYSTEM_DB]
        if not ours:
            return
        self._idle.clear()
        self._queue.put(ours)

    def publish_block_meta(self, records: list[LogtailRecord]) -> None:
        self.publish_records(records)

    def publish_checkpoint(self, records: list[LogtailRecord]) -> None:
        self.publish_records(records)

    def offsets(self) -> dict[str, int]:
        """Per topic, one past the highest offset acknowledged so far (step 5)."""
        return dict(self._ends)

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> LogtailPublisher:
        self._thread.start()
        return self

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything queued so far is produced and acknowledged."""
        deadline = time.monotonic() + timeout_s
        while not (self._queue.empty() and self._idle.is_set()):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return self._flush_producer(deadline)

    def _flush_producer(self, deadline: float) -> bool:
        """Until every record produced (and every copy produced again) is delivered."""
        while True:
            if self._producer.flush(max(0.0, deadline - time.monotonic())) != 0:
                return False
            if not self._produce_again():
                return True

    def close(self, timeout_s: float = 10.0) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout=timeout_s)
        self._flush_producer(time.monotonic() + timeout_s)

    # -- the publisher thread ----------------------------------------------------

    def _run(self) -> None:
        while True:
            # take everything queued: one poll/flush cycle per group
            items = [self._queue.get(), *drain(self._queue)]
            published = False
            for it in items:
                if it is _STOP:
                    self._flush_producer(time.monotonic() + 10)
                    return
                try:
                    if isinstance(it, int):
                        self._heartbeat(it)
                        published = False
                    elif isinstance(it, list):
                        for rec in it:
                            self._produce(self.cfg.topics.logtail(rec.database, rec.table), rec)
                    else:
                        self._publish(it)
                        published = True
                except Exception as e:  # noqa: BLE001 - keep publishing; the error is reported
                    log.exception("logtail publish failed")
                    self.errors.append(f"{type(e).__name__}: {e}")
            if published:
                # Every DDL up to the last published commit is on the catalog topic: say so,
                # so that a CN's watermark follows commits without waiting for a heartbeat.
                self._produce(
                    self.cfg.topics.catalog, LogtailRecord("", "", self.published_ts, Heartbeat())
                )
            self._producer.poll(0)
            self._produce_again()
            if self._queue.empty():
                self._idle.set()

    def _publish(self, entry: WalEntry) -> None:
        catalog, tables = collect(entry, self.view)
        for rec in catalog:
            self._track_ddl(rec)
            self._produce(self.cfg.topics.catalog, rec)
        for rec in tables:
            name = f"{rec.database}.{rec.table}"
            self._since_heartbeat.add(name)
            self._produce(self.cfg.topics.logtail(rec.database, rec.table), rec)
        self.published_lsn = entry.lsn
        self.published_ts = entry.txn.commit_ts

    def _track_ddl(self, rec: LogtailRecord) -> None:
        assert isinstance(rec.body, Catalog)
        name = f"{rec.database}.{rec.table}"
        if rec.body.op is CatalogOp.CREATE_TABLE:
            self._ensure_table_topic(name)
            self._live.add(name)
        elif rec.body.op is CatalogOp.DROP_TABLE:
            # The drop itself is on the catalog topic; a last heartbeat closes the table topic.
            self._live.discard(name)
            self._produce(
                self.cfg.topics.logtail(rec.database, rec.table),
                LogtailRecord(rec.database, rec.table, rec.commit_ts, Heartbeat(), rec.table_id),
            )

    def _ensure_table_topic(self, name: str) -> None:
        database, _, table = name.partition(".")
        spec = logtail_topic(self.cfg, database, table)
        if spec.name not in self._topics_ready:
            ensure_topics(self.cfg, [spec])
            self._topics_ready.add(spec.name)

    def _heartbeat(self, ts: int) -> None:
        self._produce(self.cfg.topics.catalog, LogtailRecord("", "", ts, Heartbeat()))
        for name in self._live:
            if name in self._since_heartbeat:
                continue
            database, _, table = name.partition(".")
            self._produce(
                self.cfg.topics.logtail(database, table),
                LogtailRecord(database, table, ts, Heartbeat()),
            )
        self._since_heartbeat.clear()
        self.published_ts = max(self.published_ts, ts)

    def _produce(self, topic: str, record: LogtailRecord) -> None:
        key = record_key(record, f"{self._key_prefix}:{next(self._seq)}".encode())
        self._produce_value(topic, key, encode_logtail(record))

    def _produce_value(self, topic: str, key: bytes, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(topic, value, key, on_delivery=self._delivered)
                return
            except BufferError:
                self._producer.poll(0.05)

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"{msg.topic()}: {err}")
        elif msg.offset() is None:
            # A duplicate-sequence answer does not prove the record was written (the embedded
            # broker gives it for records lost in a restart). Produce it again. The copy lands
            # after later records: a CN keyed on commit ts (Spark) applies it, the Python CN
            # drops it when it already applied a later LSN of the table (README).
            log.warning(
                "logtail record on %s acknowledged without an offset; producing it again",
                msg.topic(),
            )
            self._again.put((msg.topic(), msg.key(), msg.value()))
        else:
            topic = msg.topic()
            self._ends[topic] = max(self._ends.get(topic, 0), msg.offset() + 1)

    def _produce_again(self) -> int:
        """Produce the records `_delivered` queued (outside any delivery callback)."""
        n = 0
        for topic, key, value in drain(self._again):
            self._produce_value(topic, key, value)
            n += 1
        return n
