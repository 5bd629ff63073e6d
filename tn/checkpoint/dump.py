"""Blocks <-> Parquet objects (the layout CNs read, `consumers/core/table_state.py`).

Block object: `__row_id` (block_id << 16 | offset), `__commit_ts`, then one
column per column id the table ever had, named as in the schema at the
checkpoint's ts (a dropped column: `__col_<id>`). The schema metadata
`kwal.columns` maps names to column ids, so the TN reads by id (names may be
reused after a drop). Rows: every row with commit ts <= t1 (deleted ones too).

Key filter object (`filter_key`): the zone map and bloom filter of the block's
primary keys (tn.memtable.pk_filter), written with a complete block's object.

Delta object: `__row_id`, `__commit_ts` (= the delete ts) of every row deleted
at or before t1 (cumulative: the newest delta object has all of them).
"""

from __future__ import annotations

import io
import json
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from infra.objectstore import ObjectStore
from schemas.logtail import COMMIT_TS, ROW_ID
from schemas.wal import ColumnDef
from tn.catalog.nodes import ABORTED_TS, MAX_TS, BlockNode, TableNode
from tn.memtable.flushed import DroppedCols
from tn.memtable.pk_filter import KeyFilter
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


def block_snapshot(blk: BlockNode) -> tuple[int, np.ndarray, np.ndarray, dict[int, pa.Array]]:
    """A consistent (row count, cts, dts, columns) copy of the block's current state (rows
    below the count never change: the columns' arrays are not copied)."""
    mem = blk.mem
    t = blk.segment.table
    with t.mem.lock:
        n = len(mem)
        cts = np.array(mem.cts[:n], dtype=np.int64)
        dts = np.array(mem.dts[:n], dtype=np.int64)
        cols = mem.cols
    held = {} if isinstance(cols, DroppedCols) and cols.reader is not None else mem.arrays(n)
    return n, cts, dts, held


def settled(cts: np.ndarray, ts: int) -> bool:
    """Whether every row's commit ts is final as of `ts`: committed at or before it, or
    aborted. A row of a transaction still running holds MAX_TS (tn.txn.transaction) and
    may commit after ts. MAX_TS is above ABORTED_TS, so an "aborted" test written as
    `>= ABORTED_TS` takes such a row for aborted: a block dumped then was declared
    complete and dropped from memory, and the running transaction's rows were lost
    (tests/checkpoint/test_concurrent.py)."""
    return bool(np.all((cts <= ts) | (cts == ABORTED_TS)))


def dump_data(
    blk: BlockNode, t1: int, columns: list[tuple[str, ColumnDef]], block_columns: Any = None
) -> tuple[pa.Table, bool]:
    """The block's rows with commit ts <= t1; and whether that is every row it will ever
    have (full block, nothing pending)."""
    from tn.memtable.block import BLOCK_ROWS

    n, cts_a, _, cols = block_snapshot(blk)
    sel = np.nonzero(cts_a <= t1)[0]
    complete = n == BLOCK_ROWS and settled(cts_a, t1)
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
            data.append(cols[c.column_id].take(idx).cast(typ))
        else:
            data.append(pa.nulls(len(sel), typ))
    schema = pa.schema(fields, metadata={COLUMNS_META: json.dumps(mapping).encode()})
    return pa.Table.from_arrays(data, schema=schema), complete


def dump_delta(blk: BlockNode, t1: int) -> pa.Table:
    n, _, dts_a, _ = block_snapshot(blk)
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


def filter_key(meta_loc: str) -> str:
    """The key filter object written with a block object."""
    base = meta_loc[: -len(".parquet")] if meta_loc.endswith(".parquet") else meta_loc
    return base + ".pk"


class IntKeys(Sequence[Any]):
    """An int64 key column by row offset: `values`, and `present` (False: no row at that
    offset, read as None). Indexing gives Python ints, as a list of keys would."""

    __slots__ = ("values", "present")

    def __init__(self, values: np.ndarray, present: np.ndarray) -> None:
        self.values = values
        self.present = present

    def __len__(self) -> int:
        return len(self.values)

    def tolist(self) -> list[Any]:
        out: list[Any] = self.values.tolist()
        for i in np.nonzero(~self.present)[0].tolist():
            out[i] = None
        return out

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return IntKeys(self.values[i], self.present[i]).tolist()
        return int(self.values[i]) if self.present[i] else None

    def __iter__(self) -> Iterator[Any]:
        return iter(self.tolist())


class KeyRows:
    """key -> the rows holding it, of one block (`find`): int64 keys through a sorted
    array (binary search), other keys through a dict."""

    __slots__ = ("sorted_keys", "rows", "by_key")

    def __init__(self, keys: Sequence[Any]) -> None:
        self.by_key: dict[Any, tuple[int, ...]] | None = None
        if isinstance(keys, IntKeys):
            at = np.nonzero(keys.present)[0]
            order = np.argsort(keys.values[at], kind="stable")
            self.rows = at[order]
            self.sorted_keys = keys.values[self.rows]
            return
        self.sorted_keys = self.rows = np.zeros(0, dtype=np.int64)
        by_key: dict[Any, tuple[int, ...]] = {}
        for r, k in enumerate(keys):
            if k is not None:
                by_key[k] = (*by_key[k], r) if k in by_key else (r,)
        self.by_key = by_key

    def find(self, keys: Sequence[Any]) -> list[tuple[Any, tuple[int, ...]]]:
        """(key, its rows) of each of `keys` the block holds."""
        if self.by_key is not None:
            by_key = self.by_key
            return [(k, by_key[k]) for k in keys if k in by_key]
        out = []
        sk = self.sorted_keys
        for k in keys:
            if type(k) is not int or not _I64_MIN <= k <= _I64_MAX:
                continue  # not an int64: not in an int64 column
            lo = int(np.searchsorted(sk, k, "left"))
            hi = int(np.searchsorted(sk, k, "right"))
            if hi > lo:
                out.append((k, tuple(self.rows[lo:hi].tolist())))
        return out


_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


class BlockReader:
    """Reads flushed blocks from object storage (`Engine.block_columns`, and the
    `ObjectRows` of tn.memtable.flushed): columns, commit ts, delete ts, key column and
    key filters, each through a small LRU cache (evicted by count)."""

    def __init__(
        self, store: ObjectStore, cache_blocks: int = 32, bits_per_key: int = 10
    ) -> None:
        self.store = store
        self.cache_blocks = cache_blocks
        self.bits_per_key = bits_per_key
        self._caches: dict[str, OrderedDict[tuple[Any, ...], Any]] = {}
        self._lock = threading.Lock()
        self.key_loads = 0  # key columns read (filter hits that missed the cache)
        self.key_probes = 0  # key-column lookups (filter hits)

    def _cached(self, key: tuple[Any, ...], load: Any) -> Any:
        """One LRU per kind (key[0]): key lookups do not evict the column cache."""
        with self._lock:
            cache = self._caches.get(key[0])
            if cache is None:
                cache = self._caches[key[0]] = OrderedDict()
            hit = cache.get(key)
            if hit is not None:
                cache.move_to_end(key)
                return hit
        value = load()
        with self._lock:
            cache[key] = value
            while len(cache) > self.cache_blocks:
                cache.popitem(last=False)
        return value

    def __call__(self, loc: str, n: int) -> dict[int, pa.Array]:
        return self._cached(
            ("cols", loc, n), lambda: aligned_columns(from_parquet(self.store.get(loc)), n)
        )

    def _offsets(self, table: pa.Table) -> np.ndarray:
        return np.asarray(table.column(ROW_ID).to_numpy(), dtype=np.int64) & (
            (1 << OFFSET_BITS) - 1
        )

    def row_ts(self, loc: str, n: int) -> np.ndarray:
        """Commit ts of a block object's rows by offset (ABORTED_TS: no row there)."""
        cols = [ROW_ID, COMMIT_TS]
        return self._cached(("cts", loc, n), lambda: self._ts_by_offset(loc, n, ABORTED_TS, cols))

    def delete_ts(self, loc: str, n: int) -> np.ndarray:
        """Delete ts of a block's rows by offset, from its delete object (MAX_TS: live)."""
        return self._cached(("dts", loc, n), lambda: self._ts_by_offset(loc, n, MAX_TS, None))

    def _ts_by_offset(self, loc: str, n: int, fill: int, columns: list[str] | None) -> np.ndarray:
        """The object's `__commit_ts` column placed at its rows' offsets, `fill` elsewhere
        (read-only: it is shared through the cache)."""
        data = from_parquet(self.store.get(loc), columns)
        out = np.full(n, fill, dtype=np.int64)
        offs = self._offsets(data)
        keep = offs < n
        out[offs[keep]] = np.asarray(data.column(COMMIT_TS).to_numpy(), np.int64)[keep]
        out.setflags(write=False)
        return out

    def keys(self, loc: str, pk: int, n: int) -> Sequence[Any]:
        """The block's primary keys by row offset (None: no row there); int64 keys are
        held as arrays (`IntKeys`), not one Python int per key: these caches are
        long-lived and filled all along, and small objects kept between a checkpoint
        interval's rows pin the allocator's arenas once those rows are freed."""

        def load() -> Sequence[Any]:
            self.key_loads += 1
            raw = self.store.get(loc)
            meta = pq.read_schema(io.BytesIO(raw)).metadata or {}
            ids = json.loads(meta[COLUMNS_META]) if COLUMNS_META in meta else {}
            names = {int(cid): name for name, cid in ids.items()}
            if pk not in names:
                return [None] * n
            data = from_parquet(raw, [ROW_ID, names[pk]])
            offs = self._offsets(data)
            keep = offs < n
            col = data.column(names[pk]).combine_chunks()
            if pa.types.is_integer(col.type) and col.null_count == 0:
                values = np.zeros(n, dtype=np.int64)
                present = np.zeros(n, dtype=bool)
                values[offs[keep]] = np.asarray(col.to_numpy(), dtype=np.int64)[keep]
                present[offs[keep]] = True
                return IntKeys(values, present)
            out: list[Any] = [None] * n
            for o, v in zip(offs.tolist(), col.to_pylist(), strict=True):
                if o < n:
                    out[o] = v
            return out

        return self._cached(("keys", loc, pk, n), load)

    def key_rows(self, loc: str, pk: int, n: int) -> KeyRows:
        self.key_probes += 1
        return self._cached(("rows", loc, pk, n), lambda: KeyRows(self.keys(loc, pk, n)))

    def key_filter(self, blk: BlockNode, pk: int, m: int) -> KeyFilter:
        """blk's key filter of m bits: its filter object, else (none, or of another size)
        built from its key column."""
        if blk.pk_loc:
            try:
                flt = KeyFilter.decode(self.store.get(blk.pk_loc))
            except (KeyError, FileNotFoundError, ValueError):
                flt = None
            if flt is not None and flt.m == m:
                return flt
        return KeyFilter.build(self.keys(blk.meta_loc, pk, len(blk.mem)), m)
