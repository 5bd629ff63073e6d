"""Blocks <-> Parquet objects (the layout CNs read, `consumers/core/table_state.py`).

Block object: `__row_id` (block_id << 16 | offset), `__commit_ts`, then one
column per column id the table ever had, named as in the schema at the
checkpoint's ts (a dropped column: `__col_<id>`). The schema metadata
`kwal.columns` maps names to column ids, so the TN reads by id (names may be
reused after a drop). Rows: every row with commit ts <= t1 (deleted ones too).

Delta object: `__row_id`, `__commit_ts` (= the delete ts) of every row deleted
at or before t1 (cumulative: the newest delta object has all of them).
"""

from __future__ import annotations

import io
import json
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from infra.objectstore import ObjectStore
from schemas.logtail import COMMIT_TS, ROW_ID
from schemas.wal import ColumnDef
from tn.catalog.nodes import ABORTED_TS, BlockNode, TableNode
from tn.txn.rows import ARROW_TYPES

OFFSET_BITS = 16
COLUMNS_META = b"kwal.columns"


def table_columns(t: TableNode, ts: int) -> list[tuple[str, ColumnDef]]:
    """(object column name, definition) of every column id the table had up to ts."""
    current = t.schema_at(ts)
    names = {c.column_id: c.name for c in current.columns} if current is not None else {}
    seen: dict[int, ColumnDef] = {}
    for _, s in t.schemas:
        for c in s.columns:
            seen.setdefault(c.column_id, c)
    out = []
    for cid in sorted(seen):
        out.append((names.get(cid, f"__col_{cid}"), seen[cid]))
    return out


def block_snapshot(blk: BlockNode) -> tuple[int, list[int], list[int], dict[int, list[Any]]]:
    """A consistent (row count, cts, dts, cols) copy of the block's current state."""
    mem = blk.mem
    t = blk.segment.table
    with t.mem.lock:
        n = len(mem)
        cols = mem.cols
        return n, mem.cts[:n], mem.dts[:n], {cid: c[:n] for cid, c in cols.items()}


def dump_data(
    blk: BlockNode, t1: int, columns: list[tuple[str, ColumnDef]], block_columns: Any = None
) -> tuple[pa.Table, bool]:
    """The block's rows with commit ts <= t1; and whether that is every row it will ever
    have (full block, nothing pending)."""
    from tn.memtable.block import BLOCK_ROWS, DroppedCols

    n, cts, _, cols = block_snapshot(blk)
    cts_a = np.array(cts, dtype=np.int64)
    sel = np.nonzero(cts_a <= t1)[0]
    complete = n == BLOCK_ROWS and bool(np.all((cts_a <= t1) | (cts_a >= ABORTED_TS)))
    if isinstance(blk.mem.cols, DroppedCols):
        arrays = block_columns(blk.mem.cols.loc, n) if block_columns is not None else {}
    else:
        arrays = {}
    fields = [pa.field(ROW_ID, pa.int64()), pa.field(COMMIT_TS, pa.int64())]
    data: list[pa.Array] = [
        pa.array((blk.id << OFFSET_BITS) + sel.astype(np.int64), pa.int64()),
        pa.array(cts_a[sel], pa.int64()),
    ]
    idx = pa.array(sel, pa.int64())
    mapping = {}
    for name, c in columns:
        typ = ARROW_TYPES[c.type]
        fields.append(pa.field(name, typ))
        mapping[name] = c.column_id
        if c.column_id in arrays:
            data.append(arrays[c.column_id].take(idx).cast(typ))
        elif c.column_id in cols:
            data.append(pa.array(cols[c.column_id], type=typ).take(idx))
        else:
            data.append(pa.nulls(len(sel), typ))
    schema = pa.schema(fields, metadata={COLUMNS_META: json.dumps(mapping).encode()})
    return pa.Table.from_arrays(data, schema=schema), complete


def dump_delta(blk: BlockNode, t1: int) -> pa.Table:
    n, _, dts, _ = block_snapshot(blk)
    dts_a = np.array(dts, dtype=np.int64)
    sel = np.nonzero(dts_a <= t1)[0]
    return pa.table(
        {
            ROW_ID: pa.array((blk.id << OFFSET_BITS) + sel.astype(np.int64), pa.int64()),
            COMMIT_TS: pa.array(dts_a[sel], pa.int64()),
        }
    )


def to_parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def from_parquet(data: bytes, columns: list[str] | None = None) -> pa.Table:
    return pq.read_table(io.BytesIO(data), columns=columns)


def column_ids(table: pa.Table) -> dict[str, int]:
    meta = table.schema.metadata or {}
    raw = meta.get(COLUMNS_META)
    return {str(k): int(v) for k, v in json.loads(raw).items()} if raw else {}


def aligned_columns(table: pa.Table, n: int) -> dict[int, pa.Array]:
    """Column id -> array of length n indexed by row offset (missing offsets: null)."""
    offsets = np.array(table.column(ROW_ID).to_numpy(), dtype=np.int64) & ((1 << OFFSET_BITS) - 1)
    pos = np.full(n, -1, dtype=np.int64)
    keep = offsets < n
    pos[offsets[keep]] = np.nonzero(keep)[0]
    idx = pa.array(pos, mask=pos < 0)
    out: dict[int, pa.Array] = {}
    for name, cid in column_ids(table).items():
        col = table.column(name).combine_chunks()
        out[cid] = col.take(idx)
    return out


class BlockReader:
    """Reads dropped blocks' columns from object storage, with a small LRU cache
    (`Engine.block_columns`)."""

    def __init__(self, store: ObjectStore, cache_blocks: int = 32) -> None:
        self.store = store
        self.cache_blocks = cache_blocks
        self._cache: OrderedDict[tuple[str, int], dict[int, pa.Array]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, loc: str, n: int) -> dict[int, pa.Array]:
        key = (loc, n)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        cols = aligned_columns(from_parquet(self.store.get(loc)), n)
        with self._lock:
            self._cache[key] = cols
            while len(self._cache) > self.cache_blocks:
                self._cache.popitem(last=False)
        return cols
