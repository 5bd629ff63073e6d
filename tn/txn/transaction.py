"""A transaction under snapshot isolation, and its workspace.

StartTS is the engine's visible timestamp when the transaction begins: every
transaction with CommitTS <= StartTS is visible, none after it. Reads of the
catalog and of the primary-key index see that snapshot plus the transaction's
own changes.

DML is applied to the memtable at once, as uncommitted rows (invisible to
everyone: commit ts MAX_TS), concurrently with other transactions; deletes are
recorded in the workspace (by block and row) and applied at commit. DDL
creates catalog nodes with create@ = MAX_TS (only this transaction sees them)
and records drops and alters in the workspace. The commit pipeline
(`tn.commit`) checks conflicts, stamps everything with the CommitTS and logs
the WAL entry.

A transaction object is meant for one thread at a time, but its methods are
serialized by a lock, so sharing one is safe too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import pyarrow as pa

from schemas.wal import ColumnDef, TableSchema
from tn.catalog.catalog import Catalog
from tn.catalog.nodes import ABORTED_TS, MAX_TS, BlockNode, DatabaseNode, Node, TableNode
from tn.exceptions import TnError, TxnClosedError, ValidationError
from tn.memtable.columns import BLOCK_ROWS
from tn.txn.rows import Batch, Rows, column_type, key_list, to_batch

# Limit on the Arrow bytes one transaction may insert (bigger ones: "oversized").
MAX_TXN_BYTES = 64 << 20

Loc = tuple[Any, BlockNode, int]  # (primary key, block, row)
# rows appended in one block: (the batch's keys, first row in the batch, block, first
# row in the block, row count). Per range, not per row: a tuple per row that names its
# block is one more object for the cyclic collector to walk, promoted to its oldest
# generation while the transaction waits for its commit (docs/memory.md)
InsertRange = tuple[Sequence[Any], int, BlockNode, int, int]
# the transaction's own live rows: key -> block id * ROW_SLOTS + row (a plain int)
ROW_SLOTS = BLOCK_ROWS


class Transaction:
    def __init__(
        self, catalog: Catalog, submit: Callable[[Transaction], Future[int]], start_ts: int
    ) -> None:
        """`submit` enters the commit pipeline (`CommitPipeline.submit`): the engine hands it
        in, so that the transaction, which the pipeline commits, does not know the engine."""
        self.start_ts = start_ts
        self._submit = submit
        self._catalog = catalog
        self._lock = threading.Lock()
        self._state = "active"  # active | committing | committed | aborted
        # workspace
        self.ops: list[tuple[Any, ...]] = []  # DDL and appends, in call order
        self.new_nodes: list[Node] = []
        self._new_ids: set[int] = set()
        self.dropped: set[int] = set()
        self._schema: dict[int, TableSchema] = {}
        self._max_cid: dict[int, int] = {}
        self.wkeys: dict[TableNode, set[Any]] = {}  # keys written per table (conflict check)
        # ...and those of columnar inserts (int64 keys), as the batches' arrays
        self.wkey_arrays: dict[TableNode, list[np.ndarray]] = {}
        self.inserts: dict[TableNode, list[InsertRange]] = {}
        self.deletes: dict[TableNode, list[Loc]] = {}
        self._own_live: dict[TableNode, dict[Any, int]] = {}
        # inserted rows not yet in `_own_live` (keys, first row in keys, block id *
        # ROW_SLOTS + first row, count): the dict is built only when a later insert or
        # delete of the same table needs it (most transactions insert into a table once)
        self._own_ranges: dict[TableNode, list[tuple[Any, int, int, int]]] = {}
        self._own_dead: dict[TableNode, set[Any]] = {}
        self.ranges: list[tuple[BlockNode, int, int]] = []  # (block, start, n) of appended rows
        self.dml_tables: set[TableNode] = set()
        self.ddl = False  # has DDL (for the logtail's catalog records)
        self._bytes = 0

    # -- state -------------------------------------------------------------------
    @property
    def state(self) -> str:
        return self._state

    def _check_active(self) -> None:
        if self._state != "active":
            raise TxnClosedError("txn_closed", f"transaction is {self._state}")

    @property
    def has_writes(self) -> bool:
        return bool(self.ops or self.deletes or self.wkeys or self.wkey_arrays)

    def is_new(self, node: Node) -> bool:
        return node.id in self._new_ids

    # -- snapshot view -----------------------------------------------------------
    def _visible(self, node: Node) -> bool:
        if node.id in self.dropped:
            return False
        return node.id in self._new_ids or node.alive(self.start_ts)

    def _find_db(self, name: str) -> DatabaseNode | None:
        for node in reversed(tuple(self._catalog.databases.get(name, ()))):
            if self._visible(node):
                return node
        return None

    def _db(self, name: str) -> DatabaseNode:
        db = self._find_db(name)
        if db is None:
            raise ValidationError("unknown_database", f"unknown database {name!r}")
        return db

    def _find_table(self, db: DatabaseNode, name: str) -> TableNode | None:
        for node in reversed(tuple(db.tables.get(name, ()))):
            if self._visible(node):
                return node
        return None

    def _table(self, database: str, name: str) -> tuple[TableNode, TableSchema]:
        db = self._db(database)
        t = self._find_table(db, name)
        if t is None:
            raise ValidationError("unknown_table", f"unknown table {database}.{name}")
        return t, self.schema_of(t)

    def schema_of(self, t: TableNode) -> TableSchema:
        s = self._schema.get(t.id)
        if s is None:
            s = t.schema_at(self.start_ts)
            assert s is not None
        return s

    def _tables_of(self, db: DatabaseNode) -> list[TableNode]:
        out = []
        for name in list(db.tables):
            t = self._find_table(db, name)
            if t is not None:
                out.append(t)
        return out

    # -- DDL ---------------------------------------------------------------------------
    def create_database(self, name: str) -> None:
        with self._lock:
            self._check_active()
            _check_name(name)
            if self._find_db(name) is not None:
                raise ValidationError("exists", f"database {name!r} exists")
            node = self._catalog.add_database(name)
            self._new(node)
            self.ops.append(("db_create", node))

    def drop_database(self, name: str) -> None:
        with self._lock:
            self._check_active()
            db = self._db(name)
            for t in self._tables_of(db):
                self._drop_table(t)
            self.dropped.add(db.id)
            self.ops.append(("db_drop", db))
            self.ddl = True

    def create_table(
        self, database: str, name: str, columns: Sequence[Any], primary_key: str
    ) -> None:
        with self._lock:
            self._check_active()
            _check_name(name)
            db = self._db(database)
            if self._find_table(db, name) is not None:
                raise ValidationError("exists", f"table {database}.{name} exists")
            defs: list[ColumnDef] = []
            seen: set[str] = set()
            for i, col in enumerate(columns, start=1):
                if isinstance(col, (tuple, list)):
                    cname, ctype = col[0], col[1]
                    nullable = bool(col[2]) if len(col) > 2 else True
                else:
                    cname, ctype = col.name, col.type
                    nullable = bool(getattr(col, "nullable", True))
                _check_name(cname, what="column")
                if cname in seen:
                    raise ValidationError("bad_column", f"duplicate column {cname!r}")
                seen.add(cname)
                if cname == primary_key:
                    nullable = False
                defs.append(ColumnDef(i, cname, column_type(ctype), nullable))
            if primary_key not in seen:
                raise ValidationError(
                    "missing_primary_key", f"primary key {primary_key!r} is not a column"
                )
            schema = TableSchema(tuple(defs), primary_key, 1)
            node = self._catalog.add_table(db, name)
            self._new(node)
            self._schema[node.id] = schema
            self._max_cid[node.id] = len(defs)
            self.ops.append(("tbl_create", node, schema))

    def drop_table(self, database: str, name: str) -> None:
        with self._lock:
            self._check_active()
            t, _ = self._table(database, name)
            self._drop_table(t)

    def _drop_table(self, t: TableNode) -> None:
        self.dropped.add(t.id)
        self.ops.append(("tbl_drop", t))
        self.ddl = True

    def add_column(self, database: str, table: str, name: str, type: str) -> None:
        with self._lock:
            self._check_active()
            t, schema = self._table(database, table)
            _check_name(name, what="column")
            if any(c.name == name for c in schema.columns):
                raise ValidationError("exists", f"column {name!r} exists")
            # column ids are never reused: above every id this table ever had
            next_id = max(_max_column_id(t), self._max_cid.get(t.id, 0)) + 1
            self._max_cid[t.id] = next_id
            cdef = ColumnDef(next_id, name, column_type(type), True)
            self._alter(
                t, TableSchema((*schema.columns, cdef), schema.primary_key, schema.version + 1)
            )

    def drop_column(self, database: str, table: str, name: str) -> None:
        with self._lock:
            self._check_active()
            t, schema = self._table(database, table)
            if name == schema.primary_key:
                raise ValidationError("bad_column", f"cannot drop the primary key column {name!r}")
            if not any(c.name == name for c in schema.columns):
                raise ValidationError("bad_column", f"unknown column {name!r}")
            cols = tuple(c for c in schema.columns if c.name != name)
            self._alter(t, TableSchema(cols, schema.primary_key, schema.version + 1))

    def _alter(self, t: TableNode, schema: TableSchema) -> None:
        self._schema[t.id] = schema
        self.ops.append(("tbl_alter", t, schema))
        self.ddl = True

    def _new(self, node: Node) -> None:
        self.new_nodes.append(node)
        self._new_ids.add(node.id)
        self.ddl = True

    # -- DML ----------------------------------------------------------------------------
    def insert(self, database: str, table: str, rows: Rows) -> None:
        """Insert rows. Types and the primary key are validated now; a key that is live in
        this transaction's view (committed at StartTS, or inserted earlier in this
        transaction) raises ValidationError("duplicate_key") and inserts nothing."""
        with self._lock:
            self._check_active()
            t, schema = self._table(database, table)
            self._insert(t, schema, rows)

    def _insert(
        self, t: TableNode, schema: TableSchema, rows: Rows | Batch
    ) -> None:
        batch = to_batch(schema, rows)
        n = batch.n
        if n == 0:
            return
        size = batch.nbytes
        if self._bytes + size > MAX_TXN_BYTES:
            raise ValidationError("oversized", f"transaction exceeds {MAX_TXN_BYTES} bytes of rows")
        keys = batch.keys()
        # int64 keys of a columnar batch: an array, checked with numpy (no Python per row)
        arr = keys if isinstance(keys, np.ndarray) else None
        if n > 1 and (
            _has_repeats(arr) if arr is not None else len(set(keys)) != n
        ):
            raise ValidationError("duplicate_key", "duplicate primary keys in the batch")
        own_live = self._live_of(t)
        own_dead = self._own_dead.get(t)
        start = self.start_ts
        ask: Any = keys
        if own_live or own_dead:
            ask = []
            for k in keys.tolist() if arr is not None else keys:
                if own_live is not None and k in own_live:
                    raise ValidationError("duplicate_key", f"duplicate primary key {k!r}")
                if own_dead is not None and k in own_dead:
                    continue
                ask.append(k)
        # only keys written before are in `found`: the new ones (most) cost nothing here
        found = t.mem.lookup_many(ask) if len(ask) else {}
        for k, e in found.items():
            if e[3] and e[2] <= start:
                raise ValidationError("duplicate_key", f"duplicate primary key {k!r}")
        self._bytes += size
        ranges = t.mem.append(batch.by_column_id(), n, MAX_TS)
        ins = self.inserts.setdefault(t, [])
        pending = self._own_ranges.setdefault(t, [])
        for blk, row0, src, cnt in ranges:
            self.ranges.append((blk, row0, cnt))
            ins.append((keys, src, blk, row0, cnt))
            pending.append((keys, src, blk.id * ROW_SLOTS + row0, cnt))
        if own_dead:
            own_dead.difference_update(keys.tolist() if arr is not None else keys)
        if arr is not None:
            self.wkey_arrays.setdefault(t, []).append(arr)
        else:
            self.wkeys.setdefault(t, set()).update(keys)
        self.dml_tables.add(t)
        self.ops.append(("append", t, batch, ranges))

    def _live_of(self, t: TableNode) -> dict[Any, int] | None:
        """The transaction's own live rows of `t` (key -> block id * ROW_SLOTS + row),
        built now from the inserts not in it yet; None when it inserted nothing there."""
        pending = self._own_ranges.pop(t, None)
        own_live = self._own_live.get(t)
        if pending:
            if own_live is None:
                own_live = self._own_live[t] = {}
            for keys, src, at, cnt in pending:
                part = keys[src : src + cnt]
                kl = part.tolist() if isinstance(part, np.ndarray) else part
                own_live.update(zip(kl, range(at, at + cnt), strict=True))
        return own_live

    def system_op(
        self,
        build: Callable[[int], list[Any]],
        check: Callable[[], TnError | None] | None = None,
    ) -> None:
        """A system change (tn.checkpoint: flush, compact, merge, large transaction).
        At commit, under the pipeline lock: `check()` (the conflict check; an error
        aborts the transaction), then `build(commit_ts)` applies the change to the
        catalog/index and returns its WAL commands (UpdateCatalog). build must not fail."""
        with self._lock:
            self._check_active()
            self.ops.append(("sys", build, check))

    def delete(self, database: str, table: str, keys: Sequence[Any]) -> None:
        """Delete rows by primary key. A key with no live row in this transaction's view
        is a no-op (not an error, and not a write for conflict checks), unless a
        transaction that committed after StartTS wrote it: then this transaction
        will fail to commit with a write conflict."""
        with self._lock:
            self._check_active()
            t, schema = self._table(database, table)
            self._delete(t, key_list(schema, keys))

    def _delete(self, t: TableNode, keys: list[Any]) -> None:
        own_live = self._live_of(t)
        own_dead = self._own_dead.setdefault(t, set())
        start = self.start_ts
        dels = self.deletes.setdefault(t, [])
        wk = self.wkeys.setdefault(t, set())
        found = t.mem.lookup_many(
            [k for k in keys if not (own_live is not None and k in own_live) and k not in own_dead]
        )
        for k in keys:
            if own_live is not None and k in own_live:
                bid, row = divmod(own_live.pop(k), ROW_SLOTS)
                blk = t.mem.by_id[bid]
            elif k in own_dead:
                continue
            else:
                e = found.get(k)
                if e is None:
                    continue
                live = e[3]
                if e[2] > start:  # written after our snapshot: commit will conflict
                    wk.add(k)
                    continue
                if not live:
                    continue
                blk, row = e[0], e[1]
            dels.append((k, blk, row))
            own_dead.add(k)
            wk.add(k)
        if not dels:
            del self.deletes[t]
        if wk:
            self.dml_tables.add(t)
        else:
            del self.wkeys[t]

    def update(self, database: str, table: str, rows: pa.Table | Sequence[dict[str, Any]]) -> None:
        """Replace rows by primary key: delete the live row of each key (if any), insert the new one."""
        with self._lock:
            self._check_active()
            t, schema = self._table(database, table)
            batch = to_batch(schema, rows)
            keys = batch.keys()
            if len(set(keys)) != len(keys):
                raise ValidationError("duplicate_key", "duplicate primary keys in the batch")
            self._delete(t, keys)
            self._insert(t, schema, batch)

    # -- end -------------------------------------------------------------------------------
    def commit(self) -> Future[int]:
        """Enter the commit pipeline. The future completes with the CommitTS once the
        transaction is durable and visible, or fails with ConflictError / another TnError.
        A transaction without writes completes at once with its StartTS."""
        with self._lock:
            self._check_active()
            self._state = "committing"
        return self._submit(self)

    def rollback(self) -> None:
        with self._lock:
            if self._state != "active":
                return
            self._state = "aborted"
        self.discard()

    # -- used by the pipeline ---------------------------------------------------------
    def mark(self, state: str) -> None:
        self._state = state

    def discard(self) -> None:
        """Abort: mask this transaction's appended rows and forget its new catalog nodes."""
        for blk, row0, n in self.ranges:
            blk.mem.set_cts(row0, n, ABORTED_TS)
        for node in self.new_nodes:
            if node.create_ts == MAX_TS:
                self._catalog.forget(node)


def _has_repeats(keys: np.ndarray) -> bool:
    """Whether a key array holds a value twice (ascending keys, the common case: one pass)."""
    if bool((keys[1:] > keys[:-1]).all()):
        return False
    return len(np.unique(keys)) != len(keys)


def _check_name(name: Any, what: str = "name") -> None:
    if not isinstance(name, str) or not name:
        raise ValidationError("bad_request", f"invalid {what} {name!r}")


def _max_column_id(t: TableNode) -> int:
    m = 0
    for _, s in t.schemas:
        for c in s.columns:
            m = max(m, c.column_id)
    return m
