"""A CN: follows the catalog topic and its tables' logtail topics, answers reads.

Protocol (seed 001, "Push", adapted to Kafka topics):

1. Assign the catalog topic first; tables become known from its Catalog
   records (create/drop/alter), and a subscribed table's logtail topic is
   added to the assignment when its create_table arrives.
2. Apply every record idempotently (`TableState`), under one lock, and
   notify waiters: the CN watermark may have moved.
3. The watermark of a table is the highest commit or heartbeat ts applied
   from its topic; the CN watermark is the minimum over the catalog topic and
   the subscribed tables. A read at ts above it is refused: the CN cannot yet
   tell "no change" from "not yet received".
4. Positions are kept per topic, so a reconnect resumes where it stopped and
   never resets the watermark. They are also committed (asynchronously, every
   `commit_interval_s`, and once on close) to the consumer group
   `<prefix>.cn.<name>`, only so that operators can see the lag (`kwal ops
   status`); the CN itself never reads them back.

Pull (seed 001, "拉取"): a CN given the object store starts from the newest
checkpoint instead of offset 0 (`bootstrap`):

a. load the manifest and the catalog snapshot it names: every subscribed table
   alive at the checkpoint's ts t1 gets its schema history, its lifetime and
   its object-storage blocks (rows and deletes with ts <= t1), and the
   watermarks start at t1 (the CN's horizon: reads below it are refused);
b. follow the catalog topic and each table topic from the manifest's logtail
   offsets: every record with commit ts > t1 lies at or above them
   (tn.logtail.publisher, step 5); records at or below t1 met there are in the
   objects already and are skipped, heartbeats aside;
c. when a topic answers that the CN's position was truncated away (it lagged
   more than a checkpoint interval behind, or retention deleted records), the
   CN bootstraps again from the newest checkpoint, whose t1 is above anything
   the lagging topic could still have told it: the watermark moves forward.
   Where that checkpoint's offsets are themselves below a topic's log start
   (retention deleted records no checkpoint covers yet), or there is no
   checkpoint or no store, it stops with an error in `errors` naming the
   tables and the offsets lost (`_bootstrap_again`; docs/lifecycle-cn.md).

`apply(record)` is public so that any transport (Kafka here, Spark's
foreachBatch, a test) can drive the same state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from consumers.core.block_cache import DEFAULT_BATCH_ROWS, DEFAULT_MAX_BYTES, BlockCache
from consumers.core.exceptions import (
    AboveWatermarkError,
    BelowHorizonError,
    BootstrapError,
    NotSubscribedError,
    TableNotFoundError,
)
from consumers.core.scan import Scan
from consumers.core.table_state import BlockObject, TableState
from infra.config import KwalConfig
from infra.kafka_io import FETCH_WAIT_MS, poll_batch
from infra.objectstore import ObjectStore
from infra.principals import client_principal
from infra.reader_stall import StallWatch, has_records
from schemas.arrow_ipc import preload
from schemas.logtail import (
    BlockMeta,
    Catalog,
    CatalogOp,
    Changes,
    Checkpoint,
    Heartbeat,
    LogtailRecord,
    decode_logtail,
)
from tn.checkpoint.manifest import CatalogSnapshot, Manifest, newest_manifest, schema_in
from tn.txn.clock import LOGICAL_BITS

log = logging.getLogger(__name__)

# What the consumer reports, with auto.offset.reset=error, for a position below the
# partition's first record.
_TRUNCATED = (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)


class CNCore:
    """State of a set of subscribed tables, fed by `apply`; transport-free."""

    def __init__(
        self,
        tables: Iterable[str],
        load: Callable[[str], bytes] | None = None,
        cache_bytes: int = DEFAULT_MAX_BYTES,
        batch_rows: int = DEFAULT_BATCH_ROWS,
    ) -> None:
        """`cache_bytes`: how much of the objects read it keeps; `batch_rows`: the rows
        of an object decoded at a time (`BlockCache`)."""
        self.subscribed = {t for t in tables}
        self.blocks = BlockCache(load or _no_store, cache_bytes, batch_rows)
        self._lock = threading.Condition()
        self.tables: dict[str, list[TableState]] = {}  # name -> versions (by table id)
        self.marks: dict[str, int] = {}  # name -> its topic's watermark
        self.last_lsn: dict[str, int] = {}  # name -> LSN of the last applied Changes
        self.catalog_watermark = 0
        self.horizon = 0  # the ts of the checkpoint this CN bootstrapped from (0: none)
        self.last_checkpoint: tuple[int, str] | None = None
        self.on_table_created: Callable[[str], None] = lambda _name: None
        # Called with the CN watermark after each applied batch, under the lock (keep it quick).
        self.on_watermark: Callable[[int], None] | None = None

    # -- applying --------------------------------------------------------

    def _version(self, key: str, table_id: int) -> TableState:
        """The version of table `key` with `table_id` (created when first seen: its
        records can arrive before the catalog topic's create_table)."""
        versions = self.tables.setdefault(key, [])
        for state in versions:
            if state.table_id == table_id:
                return state
        database, _, name = key.partition(".")
        state = TableState(database, name, table_id)
        versions.append(state)
        return state

    def apply(self, record: LogtailRecord) -> None:
        self.apply_many([record])

    def apply_many(self, records: Iterable[LogtailRecord]) -> None:
        with self._lock:
            for record in records:
                self._apply(record)
            self._applied()

    def _applied(self) -> None:
        """After a batch of records (lock held): wake waiters, report the watermark."""
        self._lock.notify_all()
        if self.on_watermark is not None:
            self.on_watermark(self._watermark(None))

    def bootstrap(self, manifest: Manifest, snapshot: CatalogSnapshot) -> list[str]:
        """Replace all state by the checkpoint's (steps a-b of the module docstring);
        returns the subscribed tables alive at its ts, whose topics are to be followed."""
        t1 = snapshot.ts
        with self._lock:
            self.tables.clear()
            self.marks.clear()
            self.last_lsn.clear()
            self.horizon = self.catalog_watermark = t1
            self.last_checkpoint = (t1, manifest.key)
            alive: dict[int, TableState] = {}
            for key, t in snapshot.tables_alive(self.subscribed).items():
                state = self._version(key, t["id"])
                state.create_ts = t["create_ts"]
                state.schemas = [(int(ts), schema_in(s)) for ts, s in t["schemas"]]
                alive[t["id"]] = state
                self.marks[key] = t1
                self.last_lsn[key] = manifest.lsn
            for b in snapshot.blocks:
                owner = alive.get(b.table_id)
                if owner is None or not b.meta_loc:
                    continue
                owner.blocks[b.id] = BlockObject(b.block_meta())
            self._applied()
            return [f"{s.database}.{s.name}" for s in alive.values()]

    def _apply(self, record: LogtailRecord) -> None:
        body = record.body
        if record.commit_ts <= self.horizon and not isinstance(body, Heartbeat):
            return  # in the checkpoint this CN bootstrapped from
        key = f"{record.database}.{record.table}"
        if isinstance(body, Catalog):
            self._apply_catalog(record, body)
            return
        if not record.table:  # the catalog topic's own heartbeat
            self.catalog_watermark = max(self.catalog_watermark, record.commit_ts)
            return
        if key not in self.subscribed:
            return
        match body:
            case Changes():
                if record.lsn <= self.last_lsn.get(key, 0):
                    return  # re-delivered: this transaction is applied already
                self._version(key, record.table_id).apply_changes(body)
                self.last_lsn[key] = record.lsn
            case BlockMeta():
                self._version(key, record.table_id).apply_block_meta(body)
            case Checkpoint():
                self.last_checkpoint = (record.commit_ts, body.manifest_key)
        self.marks[key] = max(self.marks.get(key, 0), record.commit_ts)

    def _apply_catalog(self, record: LogtailRecord, body: Catalog) -> None:
        """A DDL record at ts C moves the catalog watermark to C - 1 only: the rest of its
        transaction (more DDL at C, its rows on the table topics) may come in a later poll,
        and a watermark of C would already claim them. The mark the TN puts on the catalog
        topic after each group it publishes (a heartbeat) then moves it to C. (It moved to
        C at once before: a create_database and a create_table of one transaction applied
        in two polls reported C, then 0 once the table existed.)"""
        self.catalog_watermark = max(self.catalog_watermark, record.commit_ts - 1)
        if body.op in (CatalogOp.CREATE_DATABASE, CatalogOp.DROP_DATABASE):
            return  # the TN sends drop_table for every table of a dropped database
        key = f"{record.database}.{record.table}"
        if key not in self.subscribed:
            return
        state = self._version(key, record.table_id)
        if body.op is CatalogOp.CREATE_TABLE:
            if state.create_ts:
                return  # re-delivered
            state.create_ts = record.commit_ts
            # nothing of the table before its creation: its topic is known up to C - 1
            self.marks[key] = max(self.marks.get(key, 0), record.commit_ts - 1)
            assert body.schema is not None, "create_table without a schema"
            state.schemas.append((record.commit_ts, body.schema))
            self.on_table_created(key)
        elif body.op is CatalogOp.DROP_TABLE:
            state.drop_ts = record.commit_ts
        elif body.op is CatalogOp.ALTER_TABLE and body.schema is not None:
            if all(ts != record.commit_ts for ts, _ in state.schemas):
                state.schemas.append((record.commit_ts, body.schema))

    # -- reading ---------------------------------------------------------

    def watermark(self, table: str | None = None) -> int:
        with self._lock:
            return self._watermark(table)

    def _watermark(self, table: str | None) -> int:
        if table is not None:
            if table not in self.subscribed:
                raise NotSubscribedError(f"table {table} is not subscribed by this CN")
            if not self._created(table):
                return self.catalog_watermark
            return min(self.catalog_watermark, self.marks.get(table, 0))
        marks = [self.catalog_watermark]
        for name in self.subscribed:
            # A table not created yet has nothing to wait for beyond the catalog.
            if self._created(name):
                marks.append(self.marks.get(name, 0))
        return min(marks)

    def rows_in_memory(self) -> int:
        """Rows this CN holds: in-memory inserts of every table version, plus the block
        objects' rows in its cache. Bounded by the rows since the last flush of each
        block plus `cache_bytes` (docs/cn-memory.md)."""
        with self._lock:
            held = sum(v.rows_in_memory() for vs in self.tables.values() for v in vs)
        return held + self.blocks.rows()

    def _created(self, table: str) -> bool:
        return any(v.create_ts for v in self.tables.get(table, ()))

    def snapshot(self, table: str, ts: int | None = None) -> pa.Table:
        """The table as of `ts` (default: the table's watermark), sorted by primary key:
        `scan`, collected (the whole table in memory; stream `scan` for a large one)."""
        return self.scan(table, ts).collect()

    def scan(self, table: str, ts: int | None = None) -> Scan:
        """The table as of `ts` (default: the table's watermark) as a stream of Arrow record
        batches in storage order (`consumers.core.scan`): what it holds at a time is one
        batch plus the object cache. The checks (watermark, horizon, the table exists at
        ts) are made here, at once; the rows are read as the scan is iterated."""
        with self._lock:
            mark = self._watermark(table)
            ts = mark if ts is None else ts
            if ts > mark:
                raise AboveWatermarkError(
                    f"{table} as of ts {ts} is not available: this CN has applied changes up to {mark}"
                )
            if ts < self.horizon:
                raise BelowHorizonError(
                    f"{table} as of ts {ts} is not available: this CN started from the checkpoint "
                    f"at ts {self.horizon} and holds no history before it"
                )
            for state in self.tables.get(table, ()):
                if state.create_ts and state.alive_at(ts):
                    return state.scan(ts, self.blocks)
            raise TableNotFoundError(f"table {table} does not exist at ts {ts}")

    def wait_for(self, ts: int, table: str | None = None, timeout_s: float = 10.0) -> bool:
        """Block until the watermark (of `table`, or the CN's) reaches ts; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._watermark(table) < ts:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return True


def newest_checkpoint(store: ObjectStore) -> tuple[Manifest, CatalogSnapshot] | None:
    """The newest checkpoint's manifest and the catalog snapshot it names (None: the store
    holds none); BootstrapError when they cannot be read. Every CN that pulls starts here."""
    try:
        manifest = newest_manifest(store)
        if manifest is None:
            return None
        return manifest, CatalogSnapshot.decode(store.get(manifest.catalog))
    except Exception as e:
        raise BootstrapError(
            f"cannot read the newest checkpoint from the object store: {type(e).__name__}: {e}"
        ) from e


def _end(consumer: Consumer, topic: str, deadline: float) -> int:
    """The high watermark of a one-partition topic (0 when it has no records)."""
    _low, high = consumer.get_watermark_offsets(
        TopicPartition(topic, 0), timeout=max(0.5, deadline - time.monotonic())
    )
    return max(0, high)


def _no_store(key: str) -> bytes:
    raise TableNotFoundError(f"block object {key} is needed but this CN has no object store")


class CN(CNCore):
    """A CN fed from Kafka: the catalog topic plus one logtail topic per subscribed table."""

    def __init__(
        self,
        cfg: KwalConfig,
        tables: Iterable[str],
        store: ObjectStore | None = None,
        *,
        name: str = "default",
        commit_interval_s: float = 1.0,
        bootstrap: bool = True,
        metrics_port: int = 0,
        cache_bytes: int | None = None,
    ) -> None:
        """With a `store` (and `bootstrap`), start from its newest checkpoint (Pull);
        without one, read every topic from its first record. `metrics_port`: serve this
        process's metrics (`infra.metrics`) on 127.0.0.1 at that port (0: the process
        serves them itself, or not at all). `cache_bytes`: see `BlockCache` (default:
        the config's `[cn] cache_bytes`)."""
        super().__init__(
            tables,
            store.get if store is not None else None,
            cfg.cn.cache_bytes if cache_bytes is None else cache_bytes,
            cfg.cn.read_batch_rows,
        )
        self.cfg = cfg
        self.store = store
        self._bootstrap = bootstrap
        if name == "default" and cfg.security.enabled:
            # secure mode: the CN's group is the one its principal may use (infra.acls)
            name = client_principal(cfg)
        self.name = name
        self.group_id = f"{cfg.topics.prefix}.cn.{name}"
        self._commit_interval_s = commit_interval_s
        self._committed: dict[str, int] = {}
        self.positions: dict[str, int] = {cfg.topics.catalog: 0}
        self._topic_table: dict[str, str] = {}
        self._pending_assign: list[str] = []
        self._consumer: Consumer | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._pause = threading.Event()  # wanted: fetch nothing (`pause`)
        self._paused = False  # the consumer is paused (set in the CN's thread, under the lock for `pause`)
        self.errors: list[str] = []
        self.bootstraps = 0  # how often step c happened
        self._offsets: dict[str, int] = {}  # the bootstrap checkpoint's logtail offsets
        self.started_from: dict[str, int] = {}  # positions set by the last bootstrap
        self.on_table_created = self._follow
        self._metrics_port = metrics_port
        self._stall = StallWatch("logtail", cfg.cn.logtail_stall_s, "cn.logtail_stall_s", self._new_consumer)

    def _follow(self, table: str) -> None:
        database, _, name = table.partition(".")
        topic = self.cfg.topics.logtail(database, name)
        if topic not in self._topic_table:
            self._topic_table[topic] = table
            self.positions.setdefault(topic, self._offsets.get(topic, 0))
            self._pending_assign.append(topic)

    def _bootstrap_from_store(self) -> Manifest | None:
        """Steps a-b: state and positions from the newest checkpoint (None: there is none)."""
        assert self.store is not None
        newest = newest_checkpoint(self.store)
        if newest is None:
            return None
        manifest, snapshot = newest
        alive = self.bootstrap(manifest, snapshot)
        offsets = self._offsets = manifest.logtail_offsets
        with self._lock:
            self.positions = {self.cfg.topics.catalog: offsets.get(self.cfg.topics.catalog, 0)}
            self._topic_table.clear()
            for table in alive:
                database, _, name = table.partition(".")
                topic = self.cfg.topics.logtail(database, name)
                self._topic_table[topic] = table
                self.positions[topic] = offsets.get(topic, 0)
            self._pending_assign = []
            self.started_from = dict(self.positions)
        return manifest

    def _new_consumer(self) -> Consumer:
        """The logtail reader's client (at start, and in place of a lost one)."""
        return Consumer(
            self.cfg.kafka_client(
                **{
                    "group.id": self.group_id,
                    "enable.auto.commit": False,
                    "fetch.wait.max.ms": FETCH_WAIT_MS,
                    # never skip silently over records truncated away: step c
                    "auto.offset.reset": "error",
                    # a replaced (fenced) TN's records are aborted: never applied
                    "isolation.level": "read_committed",
                }
            )
        )

    def start(self) -> CN:
        preload()
        if self.store is not None and self._bootstrap:
            self._bootstrap_from_store()
        self._consumer = self._new_consumer()
        self._consumer.assign([TopicPartition(t, 0, o) for t, o in self.positions.items()])
        self._export_metrics()
        self._thread = threading.Thread(target=self._run, name="kwal-cn", daemon=True)
        self._thread.start()
        return self

    def _export_metrics(self) -> None:
        """This CN's watermark and its lag behind the wall clock, read when scraped
        (`infra.metrics`, label `cn` = its name); served where the process serves them
        (`kwal cn tail --metrics-port`)."""
        from infra.metrics import METRICS, serve

        if self._metrics_port:
            serve(self._metrics_port)
        METRICS.cn_watermark.labels(self.name).set_function(self.watermark)
        METRICS.cn_lag.labels(self.name).set_function(
            lambda: max(0.0, time.time() - (self.watermark() >> LOGICAL_BITS) / 1000.0)
        )
        self._records_metric = METRICS.cn_records.labels(self.name)

    def _commit(self) -> None:
        """Commit the positions that moved since the last commit (for operators' lag only;
        a failed commit is reported in `errors` and retried at the next interval)."""
        if self._consumer is None:
            return
        with self._lock:
            moved = {t: o for t, o in self.positions.items() if o > self._committed.get(t, 0)}
        if not moved:
            return
        try:
            self._consumer.commit(
                offsets=[TopicPartition(t, 0, o) for t, o in moved.items()], asynchronous=True
            )
        except Exception as e:  # noqa: BLE001 - lag reporting must never stop the CN
            self.errors.append(f"commit of positions to group {self.group_id}: {e}")
            return
        self._committed.update(moved)

    def pause(self, timeout_s: float = 30.0) -> bool:
        """Stop fetching (an operator's hold, or a CN that cannot keep up): the watermark
        stays where it is. Records written meanwhile may be truncated away before `resume`;
        then step c applies. Returns once the CN's thread has paused its consumer (after at
        most the poll in progress; False if that took longer than `timeout_s`)."""
        self._pause.set()
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not self._paused and not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return self._paused

    def resume(self) -> None:
        """Fetch again from the positions reached before `pause`."""
        self._pause.clear()

    def _apply_pause(self) -> None:
        """Pause or resume the consumer's partitions, in the CN's thread (librdkafka's
        pause/resume from another thread while this one polls can block)."""
        assert self._consumer is not None
        if self._pause.is_set() != self._paused:
            parts = self._consumer.assignment()
            if self._pause.is_set():
                self._consumer.pause(parts)
            else:
                self._consumer.resume(parts)
            with self._lock:
                self._paused = self._pause.is_set()
                self._lock.notify_all()

    def _run(self) -> None:
        assert self._consumer is not None
        next_commit = time.monotonic() + self._commit_interval_s
        while not self._stop.is_set():
            self._apply_pause()
            if time.monotonic() >= next_commit:
                self._commit()
                next_commit = time.monotonic() + self._commit_interval_s
            messages = poll_batch(self._consumer, 500, 0.05)
            # a stalled reader (`infra.reader_stall`) is assigned again at this CN's
            # positions (one past the last record applied): nothing skipped or applied
            # twice. Not while paused: a paused reader polls nothing by design
            if self._stall.polled(has_records(messages)) and not self._paused:
                self._consumer = self._stall.unstick(
                    self._consumer, {(t, 0): o for t, o in self.positions.items()}
                )
            records: list[tuple[str, int, LogtailRecord]] = []
            truncated: list[str] = []
            for m in messages:
                err = m.error()
                if err is not None:
                    if err.code() in _TRUNCATED:
                        truncated.append(m.topic() or "")
                    elif err.code() != KafkaError._PARTITION_EOF:
                        self.errors.append(str(err))
                    continue
                try:
                    records.append((m.topic() or "", m.offset() or 0, decode_logtail(m.value() or b"")))
                except Exception as e:  # noqa: BLE001 - a bad record is reported, never applied
                    self.errors.append(f"{m.topic()}@{m.offset()}: {e}")
            if records:
                with self._lock:
                    for topic, offset, record in records:
                        self._apply(record)
                        self.positions[topic] = max(self.positions.get(topic, 0), offset + 1)
                    self._applied()
                self._records_metric.inc(len(records))
            else:
                self._skip_control_records()
            if truncated:
                self._bootstrap_again(truncated)
                continue
            if self._pending_assign:
                topics, self._pending_assign = self._pending_assign, []
                added = [TopicPartition(t, 0, self.positions.get(t, 0)) for t in topics]
                self._consumer.incremental_assign(added)
                if self._paused:
                    self._consumer.pause(added)

    def _skip_control_records(self) -> None:
        """Idle: take the consumer's own positions, which move past what is never
        delivered (transaction markers, aborted records), so `catch_up` reaches an end
        that such a record occupies."""
        assert self._consumer is not None
        try:
            assigned = self._consumer.assignment()
            if not assigned:
                return
            now = self._consumer.position(assigned)
        except KafkaException:
            return
        with self._lock:
            moved = False
            for tp in now:
                if tp.offset is not None and tp.offset > self.positions.get(tp.topic, 0):
                    self.positions[tp.topic] = tp.offset
                    moved = True
            if moved:
                self._lock.notify_all()

    def _bootstrap_again(self, topics: list[str]) -> None:
        """Step c: the records at this CN's position on `topics` are gone.

        1. ask the broker where those topics start and end now: a position between the
           two was reported by a fetch from before the last assign (nothing to do);
        2. bootstrap from the newest checkpoint (state, horizon and positions);
        3. every new position must be at or above its topic's log start: else the records
           between them were deleted before any checkpoint covered them, and the CN
           stops with an error naming the tables and the offsets lost -- it never skips
           them silently (librdkafka's auto.offset.reset is `error` for that reason)."""
        assert self._consumer is not None
        lost = {t: self.positions.get(t, 0) for t in topics}
        before = self.watermark()
        try:
            now = self._offsets_now(topics)  # 1.
            if all(now[t][0] <= o <= now[t][1] for t, o in lost.items()):
                # Reported for a position this CN has left: an error fetched before the last
                # bootstrap's assign (each topic reports its own). Fetch on from where it is.
                self._consumer.assign([TopicPartition(t, 0, o) for t, o in self.positions.items()])
                self._paused = False
                return
            beyond = {t: (now[t][1], o) for t, o in lost.items() if o > now[t][1]}
            if beyond:
                raise BootstrapError(
                    f"{self._describe(beyond)} were read by this CN and are gone from the "
                    "broker (the topic was re-created, or the broker lost acknowledged "
                    "records): start this CN again"
                )
            starts = {t: low for t, (low, _high) in now.items()}
            gone = {t: (o, max(starts.get(t, o), o)) for t, o in lost.items()}
            if self.store is None:
                raise BootstrapError(
                    f"{self._describe(gone)} were deleted (truncated after a checkpoint, or by "
                    "retention) before this CN read them, and it has no object store to "
                    "bootstrap from: give it the store the TN checkpoints to"
                )
            manifest = self._bootstrap_from_store()  # 2.
            if manifest is None:
                raise BootstrapError(
                    f"{self._describe(gone)} were deleted (truncated, or by retention) and the "
                    "object store holds no checkpoint to bootstrap from: wait for the TN's "
                    "first checkpoint (or take one: kwal checkpoint now), then start this CN "
                    "again; keep retention above the checkpoint interval (kwal ops retention "
                    "--check)"
                )
            starts.update(self._log_starts(set(self.positions) - set(starts)))
            uncovered = {t: (o, starts[t]) for t, o in self.positions.items() if o < starts[t]}
            if uncovered:  # 3.
                raise BootstrapError(
                    f"the newest checkpoint ({manifest.key}, ts {manifest.ts}) resumes "
                    f"{self._describe(uncovered)}, which were deleted before any checkpoint "
                    "covered them (retention shorter than the checkpoint interval? see kwal "
                    "ops retention --check): start this CN again once the TN has taken a newer "
                    "checkpoint (kwal checkpoint list)"
                )
        except BootstrapError as e:
            self.errors.append(str(e))
            log.error("CN %s stopped: %s", self.name, e)
            self._consumer.assign([])
            self._stop.set()
            return
        self.bootstraps += 1
        log.warning(
            "CN %s: %s were truncated away: bootstrapped again from %s (watermark %d -> %d)",
            self.name,
            self._describe({t: (o, starts.get(t, o)) for t, o in lost.items()}),
            manifest.key,
            before,
            self.watermark(),
        )
        self._consumer.assign([TopicPartition(t, 0, o) for t, o in self.positions.items()])
        self._paused = False  # a new assignment fetches; `_apply_pause` pauses it if wanted

    def _log_starts(self, topics: Iterable[str]) -> dict[str, int]:
        """topic -> the first offset its partition 0 still has."""
        return {t: low for t, (low, _high) in self._offsets_now(topics).items()}

    def _offsets_now(self, topics: Iterable[str]) -> dict[str, tuple[int, int]]:
        """topic -> (log start, end) of its partition 0 now (BootstrapError when the broker
        cannot say)."""
        assert self._consumer is not None
        out: dict[str, tuple[int, int]] = {}
        for topic in sorted(topics):
            try:
                low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, 0), timeout=10, cached=False
                )
            except KafkaException as e:
                raise BootstrapError(f"cannot read where {topic} starts now: {e}") from e
            out[topic] = (int(low), int(high))
        return out

    def _describe(self, gaps: dict[str, tuple[int, int]]) -> str:
        """'table db.a (topic t) offsets [12, 40)' for each topic -> (from, to)."""
        parts = []
        for topic, (lo, hi) in sorted(gaps.items()):
            if topic == self.cfg.topics.catalog:
                what = "the catalog"
            else:
                what = f"table {self._topic_table.get(topic, '(not followed)')}"
            parts.append(f"{what} ({topic}) offsets [{lo}, {hi})")
        return "the records of " + ", ".join(parts)

    def catch_up(self, timeout_s: float = 30.0) -> bool:
        """Wait until this CN has read every record its topics held when called: first the
        catalog topic up to its end (so that every subscribed table created by then is
        followed), then each followed table topic up to its end. False on timeout.

        What `kwal cn query` waits for before it answers at the watermark: a watermark of
        a CN still reading the backlog would be an old ts."""
        assert self._consumer is not None, "start() the CN first"
        deadline = time.monotonic() + timeout_s
        probe = Consumer(self.cfg.kafka_client(**{"group.id": f"{self.group_id}.catch-up"}))
        try:
            catalog = self.cfg.topics.catalog
            if not self._reach({catalog: _end(probe, catalog, deadline)}, deadline):
                return False
            with self._lock:
                topics = list(self._topic_table)
            return self._reach({t: _end(probe, t, deadline) for t in topics}, deadline)
        finally:
            probe.close()

    def _reach(self, ends: dict[str, int], deadline: float) -> bool:
        with self._lock:
            while any(self.positions.get(t, 0) < end for t, end in ends.items()):
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                self._lock.wait(min(left, 0.1))
            return True

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._consumer is not None:
            self._commit()
            self._consumer.close()
            self._consumer = None
