"""The catalog: the tree of databases, tables, segments and blocks, with MVCC lookups.

Ids are allocated here (one counter for every kind) and carried in the WAL, so
replay recreates nodes with the same ids (`reserve_ids`).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any

from schemas.wal import TableSchema, UpdateCatalog
from tn.catalog.nodes import BlockNode, DatabaseNode, Node, TableNode
from tn.memtable.table import TableData


class Catalog:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.databases: dict[str, list[DatabaseNode]] = {}  # name -> every version, oldest first
        self.db_name_ts: dict[str, int] = {}  # database name -> commit ts of its last DDL
        self.nodes: dict[int, Node] = {}  # every database/table/segment/block by id
        self._ids = itertools.count(1)
        self._max_id = 0
        # set by tn.checkpoint: loads a block created with its rows in object storage
        # (replay of compact/merge/large-transaction entries): fn(block, command, commit ts)
        self.block_loader: Callable[[BlockNode, UpdateCatalog, int], None] | None = None
        # set by tn.checkpoint: reads flushed blocks' rows from their objects
        # (tn.memtable.flushed.ObjectRows)
        self.objects: Any = None
        # transactions begun and not finished: the oldest StartTS bounds what the key
        # index must keep for conflict checks (TableData.prune)
        self._active: weakref.WeakSet[Any] = weakref.WeakSet()
        self._active_lock = threading.Lock()

    # -- active transactions ---------------------------------------------------------
    def begin(self, make: Callable[[], Any]) -> Any:
        """make() builds a transaction (reading its StartTS); it counts as active from
        the same instant (an atomic step for `oldest_start`)."""
        with self._active_lock:
            txn = make()
            self._active.add(txn)
        return txn

    def oldest_start(self, now: int) -> int:
        """The smallest StartTS of a transaction still active or committing (`now` when
        none): no conflict check will ever compare against a smaller ts."""
        with self._active_lock:
            live = [t for t in list(self._active) if t.state in ("active", "committing")]
            for t in list(self._active):
                if t.state not in ("active", "committing"):
                    self._active.discard(t)
        return min([now] + [t.start_ts for t in live])

    # -- ids -------------------------------------------------------------------
    def new_id(self) -> int:
        return next(self._ids)  # itertools.count is atomic under the GIL

    def reserve_ids(self, max_id: int) -> None:
        """After replay: continue allocating above every id seen in the WAL."""
        with self.lock:
            if max_id > self._max_id:
                self._max_id = max_id
                self._ids = itertools.count(max_id + 1)

    # -- node creation (uncommitted: create_ts = MAX_TS) -----------------------------
    def add_database(self, name: str, node_id: int | None = None) -> DatabaseNode:
        node = DatabaseNode(self.new_id() if node_id is None else node_id, name)
        with self.lock:
            self.databases.setdefault(name, []).append(node)
            self.nodes[node.id] = node
        return node

    def add_table(self, db: DatabaseNode, name: str, node_id: int | None = None) -> TableNode:
        mem = TableData(self.new_id, lambda: self.objects)
        node = TableNode(self.new_id() if node_id is None else node_id, db, name, mem)
        mem.table = node
        with self.lock:
            db.tables.setdefault(name, []).append(node)
            self.nodes[node.id] = node
        return node

    def register(self, node: Node) -> None:
        with self.lock:
            self.nodes[node.id] = node

    def forget(self, node: Node) -> None:
        """Remove a node whose creating transaction aborted (never committed)."""
        with self.lock:
            self.nodes.pop(node.id, None)
            if isinstance(node, DatabaseNode):
                dbs = self.databases.get(node.name, [])
                if node in dbs:
                    dbs.remove(node)
            elif isinstance(node, TableNode):
                tables = node.db.tables.get(node.name, [])
                if node in tables:
                    tables.remove(node)

    # -- MVCC lookups -------------------------------------------------------------
    def database(self, name: str, ts: int) -> DatabaseNode | None:
        for node in reversed(tuple(self.databases.get(name, ()))):
            if node.alive(ts):
                return node
        return None

    def table(self, db: DatabaseNode, name: str, ts: int) -> TableNode | None:
        for node in reversed(tuple(db.tables.get(name, ()))):
            if node.alive(ts):
                return node
        return None

    def tables(self, ts: int) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        with self.lock:
            dbs = [v for versions in self.databases.values() for v in versions]
        for db in dbs:
            if not db.alive(ts):
                continue
            names = []
            for name, versions in list(db.tables.items()):
                if any(t.alive(ts) for t in versions):
                    names.append(name)
            out[db.name] = sorted(names)
        return out

    def schema(self, table: TableNode, ts: int) -> TableSchema | None:
        return table.schema_at(ts)
