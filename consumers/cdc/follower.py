"""The change stream follower: a process beside the TN that turns the logtail into a
standard change stream (docs/change-stream.md).

Why a follower and not the TN's logtail publisher: a change event needs the row before
the change, which the logtail does not carry (a delete names a row id and its key), so
the publisher would have to keep every streamed table's rows by key, serialize with
schema registry round trips and run Kafka transactions on the TN's commit path. A
follower is a CN (consumers.core.cn): it already follows the catalog and table topics in
order, bootstraps from a checkpoint, and knows when a transaction is complete on every
table (the watermark). Its failures and its pace never touch the TN's commits.

1. Follow the catalog topic and the logtail topic of every table with a change stream
   (`cfg.change_stream`: all user tables, or the ones listed), as a CN does.
2. Keep each table's `Changes` records, by commit ts, in arrival order (`_apply`).
3. When the watermark (the minimum over the catalog and the followed tables) reaches a
   commit ts, every table's part of that transaction has arrived: take the complete
   transactions in commit ts order, turn each table's changes into events against the
   table's rows by key (consumers.cdc.events), with the table's schema at that ts
   (`_applied`, under the CN's lock), and queue them.
4. The publishing thread writes each queued batch in one Kafka transaction (producer
   `transactional.id` `<prefix>.changes`: a second follower fences the first): per kwal
   transaction a BEGIN on the transactions topic, its events on the tables' topics (key:
   the primary key; value: the envelope; both Avro, registered in the schema registry,
   Confluent wire format), then an END with the event count per table. A reader with
   `isolation.level=read_committed` sees whole batches only.
5. On start, the newest END on the transactions topic (read committed) names the last
   commit ts published: older transactions still go through step 3 (they rebuild the
   rows by key) but are not published again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from consumers.cdc.events import Event, Row, events_of
from consumers.core.cn import CN
from infra.config import KwalConfig
from infra.objectstore import ObjectStore
from infra.topics import change_stream_topics, ensure_topics
from schemas.change_stream import (
    CONNECTOR,
    VERSION,
    key_schema,
    schema_str,
    transaction_key_schema,
    transaction_value_schema,
    value_schema,
)
from schemas.logtail import Catalog, CatalogOp, Changes, LogtailRecord
from schemas.wal import TableSchema
from tn.catalog.nodes import SYSTEM_DB
from tn.checkpoint.manifest import CatalogSnapshot, Manifest
from tn.txn.clock import LOGICAL_BITS

log = logging.getLogger(__name__)

BEGIN, END = "BEGIN", "END"


class ChangeStreamError(RuntimeError):
    """The change stream cannot be published (no registry, or a gap it cannot fill)."""


@dataclass
class _Txn:
    """One kwal transaction's table records, gathered until the watermark passes it."""

    commit_ts: int
    lsn: int
    tables: list[tuple[str, int, Changes]] = field(default_factory=list)  # (db.table, id, ..)


@dataclass(frozen=True)
class TableEvents:
    table: str
    schema: TableSchema
    events: list[Event]


@dataclass(frozen=True)
class ReadyTxn:
    commit_ts: int
    lsn: int
    tables: list[TableEvents]

    @property
    def id(self) -> str:
        return str(self.lsn)


def ts_ms(commit_ts: int) -> int:
    """The wall clock part of a commit ts, in ms (FORMAT.md, "Timestamps")."""
    return commit_ts >> LOGICAL_BITS


class ChangeStreamFollower(CN):
    """Steps 1-3 of the module docstring; `ChangeStreamPublisher` does 4-5."""

    def __init__(
        self, cfg: KwalConfig, store: ObjectStore | None = None, *, resume_after_ts: int = 0
    ) -> None:
        self.stream_cfg = cfg.change_stream
        super().__init__(cfg, cfg.change_stream.table_list(), store, name="changes")
        self._txns: dict[int, _Txn] = {}
        self._rows: dict[str, dict[Any, Row]] = {}
        self.resume_after_ts = resume_after_ts
        self.ready: queue.Queue[list[ReadyTxn]] = queue.Queue()
        self.emitted_ts = 0  # the last commit ts handed to `ready` (or skipped as published)

    def _wanted(self, table: str) -> bool:
        return not table.startswith(f"{SYSTEM_DB}.") and self.stream_cfg.wants(table)

    def bootstrap(self, manifest: Manifest, snapshot: CatalogSnapshot) -> list[str]:
        """A CN's bootstrap, for every table that wants a change stream, then each table's
        rows by key at the checkpoint's ts (the `before` of later changes)."""
        if self.stream_cfg.enabled:
            databases = {d["id"]: d["name"] for d in snapshot.databases}
            names = {f"{databases[t['db_id']]}.{t['name']}" for t in snapshot.tables}
            self.subscribed |= {n for n in names if self._wanted(n)}
        with self._lock:
            self._txns.clear()  # before t1: in the checkpoint; after it: read again
        alive = super().bootstrap(manifest, snapshot)
        with self._lock:
            if self.resume_after_ts and self.horizon > self.resume_after_ts:
                self.errors.append(
                    f"change stream: transactions after ts {self.resume_after_ts} up to "
                    f"{self.horizon} were checkpointed and truncated before this follower "
                    "published them; they are not in the change stream"
                )
            self.emitted_ts = self.horizon
            for table in alive:
                pk = self._table_schema(table, self.horizon).primary_key
                snap = self.snapshot(table, self.horizon)
                self._rows[table] = {r[pk]: r for r in snap.to_pylist()}
        return alive

    def _apply_catalog(self, record: LogtailRecord, body: Catalog) -> None:
        key = f"{record.database}.{record.table}"
        if body.op is CatalogOp.CREATE_TABLE and self._wanted(key):
            self.subscribed.add(key)
        super()._apply_catalog(record, body)

    def _apply(self, record: LogtailRecord) -> None:
        """Step 2: keep a new `Changes` record (the CN's own checks decide what is new)."""
        body = record.body
        key = f"{record.database}.{record.table}"
        if (
            isinstance(body, Changes)
            and record.commit_ts > self.horizon
            and key in self.subscribed
            and record.lsn > self.last_lsn.get(key, 0)
        ):
            txn = self._txns.setdefault(record.commit_ts, _Txn(record.commit_ts, record.lsn))
            txn.tables.append((key, record.table_id, body))
        super()._apply(record)

    def _applied(self) -> None:
        """Step 3 (lock held)."""
        mark = self._watermark(None)
        done = sorted(ts for ts in self._txns if ts <= mark)
        batch: list[ReadyTxn] = []
        for ts in done:
            txn = self._txns.pop(ts)
            tables = []
            for table, _table_id, changes in txn.tables:
                schema = self._table_schema(table, ts)
                rows = self._rows.setdefault(table, {})
                events = events_of(changes, schema.primary_key, rows)
                if events:
                    tables.append(TableEvents(table, schema, events))
            if ts > self.resume_after_ts and tables:
                batch.append(ReadyTxn(ts, txn.lsn, tables))
            self.emitted_ts = ts
        self.emitted_ts = max(self.emitted_ts, mark)
        if batch:
            self.ready.put(batch)
        super()._applied()

    def _table_schema(self, table: str, ts: int) -> TableSchema:
        for state in self.tables.get(table, ()):
            if state.create_ts and state.alive_at(ts):
                return state.schema_at(ts)
        raise ChangeStreamError(f"change stream: no schema of {table} at ts {ts}")


class ChangeStreamPublisher:
    """Steps 4-5: the follower's output, in Kafka transactions, with registered schemas."""

    def __init__(
        self, cfg: KwalConfig, registry_url: str, store: ObjectStore | None = None
    ) -> None:
        if not registry_url:
            raise ChangeStreamError(
                "change stream: no schema registry (set change_stream.registry_url, or run "
                "`kwal up`, which starts one)"
            )
        self.cfg = cfg
        self.registry = SchemaRegistryClient({"url": registry_url})
        self.errors: list[str] = []
        self.published_ts = 0
        prefix = cfg.topics.prefix
        self._txn_key = AvroSerializer(self.registry, schema_str(transaction_key_schema(prefix)))
        self._txn_value = AvroSerializer(
            self.registry, schema_str(transaction_value_schema(prefix))
        )
        self._keys: dict[str, AvroSerializer] = {}
        self._values: dict[tuple[str, TableSchema], AvroSerializer] = {}
        self._topics_ready: set[str] = set()
        ensure_topics(cfg, change_stream_topics(cfg, cfg.change_stream.table_list()))
        resume = last_published_ts(cfg, self.registry)
        self.follower = ChangeStreamFollower(cfg, store, resume_after_ts=resume)
        self.published_ts = resume
        self._producer = Producer(
            cfg.kafka_client(
                **{
                    "transactional.id": f"{prefix}.changes",
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 5,
                    "message.max.bytes": cfg.max_record_bytes,
                }
            )
        )
        self._producer.init_transactions(30)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kwal-changes", daemon=True)

    def start(self) -> ChangeStreamPublisher:
        self.follower.start()
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.follower.close()
        self._producer.flush(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self.follower.ready.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                self._publish(batch)
            except Exception as e:  # noqa: BLE001 - reported; the follower stops publishing
                log.exception("change stream publish failed")
                self.errors.append(f"{type(e).__name__}: {e}")
                try:
                    self._producer.abort_transaction(10)
                except KafkaException as abort_error:  # none open, or the broker is gone
                    self.errors.append(f"abort: {abort_error}")
                return

    def _publish(self, batch: list[ReadyTxn]) -> None:
        """One Kafka transaction: BEGIN, events, END for each kwal transaction of `batch`."""
        self._producer.begin_transaction()
        for txn in batch:
            self._produce_txn_marker(txn, BEGIN, None)
            counts: dict[str, int] = {}
            total = 0
            for part in txn.tables:
                topic = self._topic(part.table)
                for event in part.events:
                    total += 1
                    counts[part.table] = counts.get(part.table, 0) + 1
                    self._produce_event(topic, part, event, txn, total, counts[part.table])
            self._produce_txn_marker(txn, END, counts)
        self._producer.commit_transaction(30)
        self.published_ts = batch[-1].commit_ts

    def _topic(self, table: str) -> str:
        database, _, name = table.partition(".")
        topic = self.cfg.topics.changes(database, name)
        if topic not in self._topics_ready:
            ensure_topics(self.cfg, change_stream_topics(self.cfg, [table])[1:])
            self._topics_ready.add(topic)
        return topic

    def _produce_event(
        self, topic: str, part: TableEvents, event: Event, txn: ReadyTxn, total: int, order: int
    ) -> None:
        database, _, name = part.table.partition(".")
        prefix = self.cfg.topics.prefix
        key_ser = self._keys.get(part.table)
        if key_ser is None:
            key_ser = AvroSerializer(
                self.registry, schema_str(key_schema(prefix, database, name, part.schema))
            )
            self._keys[part.table] = key_ser
        value_ser = self._values.get((part.table, part.schema))
        if value_ser is None:
            value_ser = AvroSerializer(
                self.registry, schema_str(value_schema(prefix, database, name, part.schema))
            )
            self._values[(part.table, part.schema)] = value_ser
        columns = [c.name for c in part.schema.columns]
        value = {
            "before": _project(event.before, columns),
            "after": _project(event.after, columns),
            "source": {
                "version": VERSION,
                "connector": CONNECTOR,
                "name": prefix,
                "ts_ms": ts_ms(txn.commit_ts),
                "db": database,
                "table": name,
                "commit_ts": txn.commit_ts,
                "lsn": txn.lsn,
                "txId": txn.id,
            },
            "op": event.op,
            "ts_ms": int(time.time() * 1000),
            "transaction": {"id": txn.id, "total_order": total, "data_collection_order": order},
        }
        key = key_ser({part.schema.primary_key: event.key}, SerializationContext(topic, MessageField.KEY))
        data = value_ser(value, SerializationContext(topic, MessageField.VALUE))
        self._produce(topic, key, data)

    def _produce_txn_marker(self, txn: ReadyTxn, status: str, counts: dict[str, int] | None) -> None:
        topic = self.cfg.topics.changes_transactions
        value = {
            "status": status,
            "id": txn.id,
            "event_count": None if counts is None else sum(counts.values()),
            "data_collections": None
            if counts is None
            else [{"data_collection": t, "event_count": n} for t, n in counts.items()],
            "ts_ms": ts_ms(txn.commit_ts),
            "commit_ts": txn.commit_ts,
        }
        key = self._txn_key({"id": txn.id}, SerializationContext(topic, MessageField.KEY))
        self._produce(topic, key, self._txn_value(value, SerializationContext(topic, MessageField.VALUE)))

    def _produce(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        while True:
            try:
                self._producer.produce(topic, value, key, on_delivery=self._delivered)
                return
            except BufferError:
                self._producer.poll(0.05)

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"{msg.topic()}: {err}")


def _project(row: Row | None, columns: Iterable[str]) -> Row | None:
    """`row` with exactly the schema's columns (one added later is null in older rows)."""
    if row is None:
        return None
    return {c: row.get(c) for c in columns}


def last_published_ts(cfg: KwalConfig, registry: SchemaRegistryClient, timeout_s: float = 15.0) -> int:
    """Step 5: the commit ts of the newest committed END on the transactions topic (0:
    none). Read committed, from the topic's end backwards in growing windows: the tail may
    hold an aborted batch (a follower that died mid-transaction), which is skipped."""
    topic = cfg.topics.changes_transactions
    consumer = Consumer(
        cfg.kafka_client(
            **{
                "group.id": f"{cfg.topics.prefix}.changes-resume",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
            }
        )
    )
    deserialize = AvroDeserializer(registry)
    deadline = time.monotonic() + timeout_s
    try:
        low, high = _watermarks(consumer, topic, deadline)
        end, window = high, 64
        while end > low:
            start = max(low, end - window)
            newest = _newest_end(consumer, deserialize, topic, start, end, deadline)
            if newest:
                return newest
            end, window = start, window * 4
        return 0
    finally:
        consumer.close()


_NOT_READY = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
)


def _watermarks(consumer: Consumer, topic: str, deadline: float) -> tuple[int, int]:
    """The topic's low and high offsets. A topic created a moment ago can answer "not
    leader" until its leader is known: asked again, within the deadline."""
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, 0), timeout=max(0.5, deadline - time.monotonic())
            )
            return int(low), int(high)
        except KafkaException as e:
            error = e.args[0]
            if not (error.retriable() or error.code() in _NOT_READY) or time.monotonic() > deadline:
                raise ChangeStreamError(f"change stream: the offsets of {topic}: {e}") from e
            time.sleep(0.1)


def _newest_end(
    consumer: Consumer, deserialize: AvroDeserializer, topic: str, start: int, end: int,
    deadline: float,
) -> int:
    """The commit ts of the last END in offsets [start, end) (0: none there)."""
    consumer.assign([TopicPartition(topic, 0, start)])
    newest = 0
    while time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return newest
            raise ChangeStreamError(f"change stream: reading {topic}: {err}")
        if (msg.offset() or 0) >= end:
            return newest
        value: Any = deserialize(msg.value(), SerializationContext(topic, MessageField.VALUE))
        if value and value["status"] == END:
            newest = int(value["commit_ts"])
    raise ChangeStreamError(f"change stream: {topic} not read back within the time allowed")
