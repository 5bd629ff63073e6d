"""The transaction node's in-process engine: catalog + memtable + transactions + commit pipeline.

    engine = Engine(LogStore(MemoryDriver()))          # or Engine.recover(log) after a restart
    txn = engine.begin()
    txn.create_database("db"); txn.create_table("db", "t", [("id", "int64"), ("v", "string")], "id")
    txn.insert("db", "t", [{"id": 1, "v": "a"}])
    commit_ts = txn.commit().result()                 # ConflictError / LogFailedError / ...
    engine.read("db", "t")                            # latest committed snapshot, sorted by key

Everything is thread-safe; many threads run transactions concurrently.

Snapshots: a transaction's StartTS is the engine's visible timestamp (every
transaction with CommitTS <= it is visible). `now()` is a fresh HLC timestamp;
`read(..., ts)` first waits until every transaction queued with CommitTS <= ts
has become visible (or failed), so reads at a ts are repeatable.

Semantics in short (snapshot isolation, first committer wins):
- insert: ValidationError("duplicate_key") at once if the key is live in the
  transaction's view (committed at StartTS, or inserted earlier in it);
- delete by key: a key without a live row is a no-op;
- update = delete (if live) + insert;
- commit fails with ConflictError("write_conflict") if a transaction that
  committed (or was queued to commit) after StartTS wrote one of its keys, and
  ConflictError("ddl_conflict") if a table it writes or alters was dropped or
  altered concurrently, a database it drops got tables concurrently, or a name
  it creates was created/dropped concurrently;
- a failed WAL append fails that commit and every later queued one with
  LogFailedError, and the engine stops (EngineClosedError from then on);
  restart with `Engine.recover`.
- Do not block in a commit future's done-callback or a commit listener: they
  run on the commit path (a callback waiting for another commit can deadlock).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pyarrow as pa

from schemas.arrow_ipc import preload
from schemas.wal import TableSchema
from tn.catalog.catalog import Catalog
from tn.catalog.nodes import TableNode
from tn.commit.pipeline import CommitListener, CommitPipeline
from tn.exceptions import EngineClosedError, LogFailedError, ValidationError
from tn.logstore.driver import LogStore
from tn.memtable.block import DroppedCols
from tn.memtable.columns import column_arrays
from tn.replay import replay
from tn.txn.clock import LOGICAL_BITS, HybridClock
from tn.txn.rows import ARROW_TYPES, arrow_schema
from tn.txn.transaction import Transaction

__all__ = ["Engine", "Transaction"]

# How far ahead of the clock a read ts may be (10 s in HLC units); a read at ts pushes the
# clock to ts so that every later commit gets a greater CommitTS (repeatable reads).
MAX_FUTURE_TS = 10_000 << LOGICAL_BITS


class Engine:
    def __init__(self, log: LogStore, *, commit_queue: int = 4096) -> None:
        """An empty engine writing its WAL to `log` (use `recover` for a log with entries).
        The engine does not own the log store: `close()` leaves it open."""
        preload()
        self.log = log
        self.catalog = Catalog()
        self.clock = HybridClock()
        self.pipeline = CommitPipeline(self.catalog, log, self.clock, commit_queue)
        self._closed = False
        # set by tn.checkpoint: reads the columns of blocks dropped from memory after a
        # checkpoint dumped them: fn(object key, row count) -> column id -> Arrow array
        # aligned on row offsets
        self.block_columns: BlockColumns | None = None

    @classmethod
    def recover(cls, log: LogStore, **kw: Any) -> Engine:
        """Rebuild the engine by replaying every entry of `log` (same ids, blocks, row offsets).
        A log truncated by a checkpoint lacks its head: use `tn.checkpoint.recover`."""
        if log.truncated() > 0:
            raise ValueError(
                f"the WAL is truncated at LSN {log.truncated()} (a checkpoint): recover with "
                "tn.checkpoint.recover(log, object_store), which loads the checkpoint first"
            )

        engine = cls(log, **kw)
        last_ts = replay(engine.catalog, log.runs())
        engine.clock.observe(last_ts)
        engine.pipeline.visible_ts = max(engine.pipeline.visible_ts, last_ts)
        return engine

    # -- transactions -------------------------------------------------------------------
    def begin(self) -> Transaction:
        self._check_open()
        pipeline = self.pipeline
        txn: Transaction = self.catalog.begin(
            lambda: Transaction(self.catalog, pipeline.submit, pipeline.visible_ts)
        )
        return txn

    def now(self) -> int:
        """A fresh HLC timestamp (for reads "as of now")."""
        return self.clock.now()

    @property
    def visible_ts(self) -> int:
        """Every transaction with CommitTS <= this is visible (0 before the first commit)."""
        return self.pipeline.visible_ts

    def add_commit_listener(self, fn: CommitListener) -> None:
        """Call fn(entry) for each committed transaction, after it became visible, in LSN
        order, from one thread at a time (before the committer's future completes).
        Keep it quick: it runs on the commit path."""
        self.pipeline.listeners.append(fn)

    def remove_commit_listener(self, fn: CommitListener) -> None:
        self.pipeline.listeners.remove(fn)

    def heartbeat(self) -> Future[int]:
        """Run an empty "heartbeat" transaction through the commit queue: it draws a
        timestamp in queue order and logs nothing. When it completes (with that ts), every
        transaction with a smaller CommitTS is visible and was passed to the commit
        listeners, and the heartbeat listeners were called with the ts (the logtail's
        watermark: "nothing more at or below ts")."""
        self._check_open()
        return self.pipeline.heartbeat()

    def add_heartbeat_listener(self, fn: Callable[[int], None]) -> None:
        """Call fn(ts) for each heartbeat, in queue order with the commit listeners."""
        self.pipeline.heartbeat_listeners.append(fn)

    def remove_heartbeat_listener(self, fn: Callable[[int], None]) -> None:
        self.pipeline.heartbeat_listeners.remove(fn)

    # -- reads --------------------------------------------------------------------------
    def _snapshot(self, ts: int | None) -> int:
        if ts is None:
            return self.pipeline.visible_ts
        if ts > self.clock.now() + MAX_FUTURE_TS:
            raise ValidationError("bad_request", f"read timestamp {ts} is in the future")
        self.clock.observe(ts)
        self.pipeline.wait_visible(ts)
        return ts

    def _table_at(self, database: str, table: str, ts: int) -> tuple[TableNode, TableSchema]:
        db = self.catalog.database(database, ts)
        if db is None:
            raise ValidationError("unknown_database", f"unknown database {database!r} at {ts}")
        t = self.catalog.table(db, table, ts)
        if t is None:
            raise ValidationError("unknown_table", f"unknown table {database}.{table} at {ts}")
        schema = t.schema_at(ts)
        assert schema is not None
        return t, schema

    def read(self, database: str, table: str, ts: int | None = None) -> pa.Table:
        """The table as of ts (default: the latest visible state): user columns in schema
        order, rows sorted by primary key. With a ts, first waits until every commit
        with CommitTS <= ts has become visible or failed."""
        ts = self._snapshot(ts)
        t, schema = self._table_at(database, table, ts)
        return read_table(t, schema, ts, self.block_columns)

    def tables(self, ts: int | None = None) -> dict[str, list[str]]:
        """database -> sorted table names, for databases alive at ts."""
        return self.catalog.tables(self._snapshot(ts))

    def schema(self, database: str, table: str, ts: int | None = None) -> TableSchema:
        return self._table_at(database, table, self._snapshot(ts))[1]

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def log_failure(self) -> LogFailedError | None:
        """Why the engine stopped after a log failure (None while it has not): recover a
        new engine from the log to go on."""
        return self.pipeline.failed

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("engine_closed", "engine is closed")
        failed = self.pipeline.failed
        if failed is not None:
            raise EngineClosedError(
                "engine_closed", f"engine stopped after a log failure: {failed.message}"
            )

    def close(self) -> None:
        """Refuse new transactions and commits; wait (up to 30 s) for queued commits."""
        self._closed = True
        self.pipeline.close()


BlockColumns = Callable[[str, int], dict[int, pa.Array]]


def read_table(
    t: TableNode, schema: TableSchema, ts: int, block_columns: BlockColumns | None = None
) -> pa.Table:
    target = arrow_schema(schema)
    chunks: list[list[pa.Array]] = [[] for _ in schema.columns]
    for blk, n in t.mem.block_rows():
        if blk.create_ts > ts or blk.delete_ts <= ts or n == 0:
            continue
        mem = blk.mem
        cols = mem.cols  # once: a checkpoint may swap in DroppedCols meanwhile
        mask = mem.visible_mask(ts, n)
        k = int(mask.sum())
        if k == 0:
            continue
        pmask = pa.array(mask)
        if isinstance(cols, DroppedCols):
            if block_columns is None:
                raise RuntimeError(f"block {blk.id} is in object storage, but no reader is set")
            loaded = block_columns(cols.loc, n)
            for i, c in enumerate(schema.columns):
                arr = loaded.get(c.column_id)
                typ = ARROW_TYPES[c.type]
                if arr is None:
                    chunks[i].append(pa.nulls(k, typ))
                else:
                    chunks[i].append(arr.filter(pmask).cast(typ))
            continue
        wanted = {c.column_id for c in schema.columns}
        held = column_arrays({cid: c for cid, c in cols.items() if cid in wanted}, n)
        for i, c in enumerate(schema.columns):
            arr = held.get(c.column_id)
            typ = ARROW_TYPES[c.type]
            if arr is None:
                chunks[i].append(pa.nulls(k, typ))
            else:
                chunks[i].append(arr.filter(pmask).cast(typ))
    arrays = [
        pa.chunked_array(ch, type=f.type) if ch else pa.chunked_array([], type=f.type)
        for ch, f in zip(chunks, target, strict=True)
    ]
    out = pa.Table.from_arrays(arrays, schema=target)
    return out.sort_by([(schema.primary_key, "ascending")]).combine_chunks()
