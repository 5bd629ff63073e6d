"""Catalog tree nodes: database -> table -> segment -> block, each with create@/delete@.

MVCC: a node is alive at ts iff ``create_ts <= ts < delete_ts``. A node created
by a transaction that has not committed has ``create_ts == MAX_TS`` (invisible
to every reader); a live node has ``delete_ts == MAX_TS``. In the WAL a live
node's delete@ is written as 0.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

import numpy as np

from schemas.wal import CatalogKind, TableSchema

# The TN's own bookkeeping tables (request ids, progress) live here; the logtail skips it.
SYSTEM_DB = "kwal_system"

MAX_TS = (1 << 63) - 1  # "uncommitted" create@ / row commit ts, and "never" delete@
ABORTED_TS = MAX_TS - 1  # commit ts of rows whose transaction aborted (never visible)


class BlockMemory(Protocol):
    """What the catalog knows of a block's rows (`tn.memtable.block.MemBlock`): the nodes
    stand below the memtable, which builds on them, so they name only this interface."""

    cols: dict[int, Any]  # column id -> tn.memtable.columns.Column; DroppedCols once flushed

    @property
    def cts(self) -> Any: ...  # int64 array view of the rows; a view over the object once flushed

    @property
    def dts(self) -> Any: ...

    def __len__(self) -> int: ...

    def load(self, cts: np.ndarray, dts: np.ndarray, cols: dict[int, Any]) -> None: ...

    @property
    def free(self) -> int: ...

    def write(
        self, columns: dict[int, list[Any]], src: int, n: int, cts: int, types: Any = ...
    ) -> int: ...

    def put(
        self, at: int, columns: dict[int, list[Any]], src: int, n: int, types: Any = ...
    ) -> None: ...

    def arrays(self, n: int) -> dict[int, Any]: ...

    def pad(self, n: int, cts: int) -> None: ...

    def set_cts(self, start: int, n: int, ts: int) -> None: ...

    def visible_mask(self, ts: int, n: int) -> np.ndarray: ...

    @property
    def flushed(self) -> bool: ...

    def running_row(self) -> int | None: ...

    def flush(
        self,
        reader: Any,
        loc: str,
        delta_loc: str,
        pk: int,
        override: int = 0,
        n: int | None = None,
    ) -> None: ...


class TableMemory(Protocol):
    """What the catalog knows of a table's rows and key index (`tn.memtable.table.TableData`)."""

    lock: threading.Lock
    blocks: list[BlockNode]
    index: Any  # tn.memtable.pk_index.PkIndex: key -> (block id, row, ts, live)
    by_id: dict[int, BlockNode]
    index_lock: threading.Lock
    objects: Any  # () -> the object reader (tn.memtable.flushed.ObjectRows) or None

    def lookup_many(self, keys: Any) -> dict[Any, list[Any]]: ...

    def pk_cid(self) -> int: ...

    def register_flushed(self, blk: BlockNode, flt: Any = None, keys: Any = None) -> None: ...

    def column_types(self) -> dict[int, Any]: ...

    def prune(self, upto: int) -> int: ...

    def append(
        self, columns: dict[int, list[Any]], n: int, cts: int
    ) -> list[tuple[BlockNode, int, int, int]]: ...

    def place(
        self,
        blk: BlockNode,
        offset: int,
        columns: dict[int, list[Any]],
        src: int,
        n: int,
        cts: int,
        hole_ts: int,
    ) -> None: ...

    def add_segment(self, seg: SegmentNode) -> None: ...

    def add_block(self, blk: BlockNode) -> None: ...

    def block_rows(self) -> list[tuple[BlockNode, int]]: ...

    def index_commit(
        self,
        inserts: list[tuple[Any, int, BlockNode, int, int]],
        deletes: list[tuple[Any, BlockNode, int]],
        ts: int,
    ) -> None: ...


class Node:
    __slots__ = ("id", "kind", "name", "create_ts", "delete_ts")

    def __init__(self, node_id: int, kind: CatalogKind, name: str = "") -> None:
        self.id = node_id
        self.kind = kind
        self.name = name
        self.create_ts = MAX_TS
        self.delete_ts = MAX_TS

    def alive(self, ts: int) -> bool:
        return self.create_ts <= ts < self.delete_ts

    @property
    def committed(self) -> bool:
        return self.create_ts != MAX_TS


class DatabaseNode(Node):
    __slots__ = ("tables", "name_ts", "child_ts")

    def __init__(self, node_id: int, name: str) -> None:
        super().__init__(node_id, CatalogKind.DATABASE, name)
        self.tables: dict[str, list[TableNode]] = {}  # name -> every version, oldest first
        self.name_ts: dict[str, int] = {}  # table name -> commit ts of the last DDL on that name
        self.child_ts = 0  # commit ts of the last create/drop of a table in this database


class TableNode(Node):
    __slots__ = ("db", "schemas", "ddl_ts", "mem")

    def __init__(self, node_id: int, db: DatabaseNode, name: str, mem: TableMemory) -> None:
        super().__init__(node_id, CatalogKind.TABLE, name)
        self.db = db
        self.schemas: list[tuple[int, TableSchema]] = []  # (commit ts, schema), oldest first
        self.ddl_ts = 0  # commit ts of the last create/alter/drop of this table
        self.mem = mem

    def schema_at(self, ts: int) -> TableSchema | None:
        for t, s in reversed(self.schemas):
            if t <= ts:
                return s
        return None


class SegmentNode(Node):
    __slots__ = ("table", "blocks")

    def __init__(self, node_id: int, table: TableNode) -> None:
        super().__init__(node_id, CatalogKind.SEGMENT)
        self.table = table
        self.blocks: list[BlockNode] = []


class BlockNode(Node):
    __slots__ = ("segment", "mem", "meta_loc", "delta_loc", "pk_loc")

    def __init__(self, node_id: int, segment: SegmentNode, mem: BlockMemory) -> None:
        super().__init__(node_id, CatalogKind.BLOCK)
        self.segment = segment
        self.mem = mem
        # checkpoint (tn.checkpoint): the object holding the block's rows (with commit ts
        # <= the ts in its key) and the object holding its deletes; "" while never dumped
        self.meta_loc = ""
        self.delta_loc = ""
        self.pk_loc = ""  # the key filter of meta_loc (tn.memtable.pk_filter); "" = none
