"""A table's in-memory data: its segments and blocks, and the primary-key index.

Appends reserve row ranges in the open block (opening new blocks/segments as
blocks fill up) under the table lock, so concurrent transactions append
without waiting for each other's commits. New segments/blocks are catalog
nodes with create@ = MAX_TS until the first transaction with rows in them
commits (that transaction logs their creation).

The primary-key index (`PkIndex`, tn.memtable.pk_index) maps key -> (block id, row,
last_write_ts, live): the newest committed (or queued-to-commit) write of that key. It
is updated in commit order by the pipeline, and serves the write-write conflict check
and delete-by-key. It holds only the working set (docs/memory.md): the checkpoint
prunes (`prune`) the entries of rows in flushed blocks once no active transaction
started before them (a conflict check, `ts > StartTS`, could not hit them any
more). Duplicate-key checks and deletes find those keys through the flushed
blocks' key filters (`lookup_many`, tn.memtable.flushed): a filter hit reads the
block's key column; the row's commit/delete ts come from its objects. Integer keys
are held in numpy arrays, not as a Python object per key.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np
import pyarrow as pa

from schemas.arrow_ipc import ARROW_TYPES
from tn.catalog.nodes import ABORTED_TS, MAX_TS, BlockNode, SegmentNode, TableNode
from tn.memtable.block import BLOCK_ROWS, MemBlock
from tn.memtable.flushed import DroppedCols, FlushedKeys, ObjectRows
from tn.memtable.pk_filter import KeyFilter, filter_bits
from tn.memtable.pk_index import PkIndex

SEGMENT_BLOCKS = 16

# (block, first row in block, first row in batch, row count)
Range = tuple[BlockNode, int, int, int]


class TableData:
    __slots__ = (
        "lock",
        "segments",
        "blocks",
        "index",
        "index_lock",
        "by_id",
        "flushed",
        "objects",
        "open_block",
        "_alloc",
        "table",
        "_types",
        "unpruned",
    )

    def __init__(
        self,
        alloc_id: Callable[[], int],
        objects: Callable[[], ObjectRows | None] | None = None,
    ) -> None:
        self.lock = threading.Lock()
        self.segments: list[SegmentNode] = []
        self.blocks: list[BlockNode] = []
        self.index = PkIndex()
        self.by_id: dict[int, BlockNode] = {}  # the index's block ids -> blocks
        # serializes index writers (the pipeline's index_commit, the checkpoint's prune);
        # readers read the index without it
        self.index_lock = threading.Lock()
        self.flushed = FlushedKeys()
        self.objects = objects or (lambda: None)  # the object reader (tn.checkpoint)
        self.open_block: BlockNode | None = None
        self._alloc = alloc_id
        self.table: TableNode | None = None  # set by the catalog
        self._types: tuple[int, dict[int, pa.DataType]] = (-1, {})
        # flushed blocks whose rows may still have index entries (block id -> keys of
        # entries a prune had to keep, or of deletes of its rows since): what `prune`
        # looks at
        self.unpruned: dict[int, Any] = {}

    def column_types(self) -> dict[int, pa.DataType]:
        """column id -> Arrow type, over every schema the table has had."""
        t = self.table
        if t is None:
            return {}
        seen, types = self._types
        if seen != len(t.schemas):
            types = {}
            for _, schema in t.schemas:
                for c in schema.columns:
                    types[c.column_id] = ARROW_TYPES[c.type]
            self._types = (len(t.schemas), types)
        return types

    # -- live appends -------------------------------------------------------
    def append(self, columns: dict[int, list[Any]], n: int, cts: int) -> list[Range]:
        """Append n rows (as uncommitted, `cts` = MAX_TS) and return where they landed."""
        out: list[Range] = []
        src = 0
        types = self.column_types()
        with self.lock:
            while src < n:
                blk = self.open_block
                if blk is None or blk.mem.free == 0:
                    blk = self._new_block()
                take = min(n - src, blk.mem.free)
                start = blk.mem.write(columns, src, take, cts, types)
                out.append((blk, start, src, take))
                src += take
        return out

    def _new_block(self) -> BlockNode:
        assert self.table is not None
        seg = self.segments[-1] if self.segments else None
        if seg is None or len(seg.blocks) >= SEGMENT_BLOCKS:
            seg = SegmentNode(self._alloc(), self.table)
            self.segments.append(seg)
        blk = BlockNode(self._alloc(), seg, MemBlock())
        seg.blocks.append(blk)
        self.blocks.append(blk)
        self.by_id[blk.id] = blk
        self.open_block = blk
        return blk

    # -- replay ---------------------------------------------------------------
    def segment(self, seg_id: int) -> SegmentNode | None:
        for seg in reversed(self.segments):
            if seg.id == seg_id:
                return seg
        return None

    def add_segment(self, seg: SegmentNode) -> None:
        with self.lock:
            self.segments.append(seg)

    def add_block(self, blk: BlockNode) -> None:
        with self.lock:
            blk.segment.blocks.append(blk)
            self.blocks.append(blk)
            self.by_id[blk.id] = blk
            if self.open_block is None or blk.id > self.open_block.id:
                self.open_block = blk

    def place(
        self,
        blk: BlockNode,
        offset: int,
        columns: dict[int, list[Any]],
        src: int,
        n: int,
        cts: int,
        hole_ts: int,
    ) -> None:
        """Write rows at exactly `offset` of `blk` (replay). Transactions commit in another
        order than they reserved rows, so rows may land beyond the end (the gap is filled
        with placeholders of commit ts `hole_ts`) or into such placeholders."""
        with self.lock:
            mem = blk.mem
            if offset + n > BLOCK_ROWS:
                raise ValueError(f"block {blk.id}: append beyond {BLOCK_ROWS} rows")
            end = offset + n
            if len(mem) < end:
                mem.pad(end - len(mem), hole_ts)
            taken = np.nonzero(mem.cts[offset:end] != hole_ts)[0]
            if len(taken):
                raise ValueError(f"block {blk.id}: row {offset + int(taken[0])} is already taken")
            mem.put(offset, columns, src, n, self.column_types())
            mem.set_cts(offset, n, cts)

    def place_rows(
        self,
        blk: BlockNode,
        rows: Sequence[int],
        columns: Mapping[int, Sequence[Any]],
        cts: Sequence[int],
        hole_ts: int,
    ) -> None:
        """`place` of many transactions' rows at once (replay of a run of entries into one
        block): row rows[i] of `blk` takes each column's values[i] and commit ts cts[i].
        The same checks: inside the block, gaps padded with `hole_ts` placeholders, no row
        taken already (nor twice). Lists in: the checks on a few rows cost less in Python
        than numpy's per-call cost; numpy does the writes."""
        n = len(rows)
        if not n:
            return
        lo, end = min(rows), max(rows) + 1
        ascending = n == 1 or (end - lo == n and rows[0] == lo and list(rows) == sorted(rows))
        with self.lock:
            mem = cast(MemBlock, blk.mem)  # the memtable's blocks (the nodes name a Protocol)
            if lo < 0 or end > BLOCK_ROWS:
                raise ValueError(f"block {blk.id}: append outside its {BLOCK_ROWS} rows")
            if len(mem) < end:
                mem.pad(end - len(mem), hole_ts)
            at = np.array(rows, dtype=np.int64)
            taken = mem.cts[at] != hole_ts
            if taken.any():
                first = int(rows[int(np.argmax(taken))])
                raise ValueError(f"block {blk.id}: row {first} is already taken")
            if not ascending and len(set(rows)) != n:
                raise ValueError(f"block {blk.id}: a row is placed twice")
            mem.put_rows(at, columns, self.column_types(), ascending)
            mem.set_cts_rows(at, np.array(cts, dtype=np.int64))

    def block_rows(self) -> list[tuple[BlockNode, int]]:
        """Snapshot of (block, row count) for readers."""
        with self.lock:
            return [(b, len(b.mem)) for b in self.blocks]

    # -- index ------------------------------------------------------------------
    def index_commit(
        self,
        inserts: list[tuple[Sequence[Any], int, BlockNode, int, int]],
        deletes: list[tuple[Any, BlockNode, int]],
        ts: int,
    ) -> None:
        """Record a committing transaction's writes: its inserts in order (ranges: keys,
        first row in keys, block, first row in the block, count), then its deletes.
        A delete of a row whose entry was pruned (a flushed row) enters the index: later
        conflict checks must see it."""
        idx = self.index
        by_id = self.by_id
        with self.index_lock:
            if len(inserts) == 1 and inserts[0][4] == 1:
                keys, src, blk, row0, _ = inserts[0]
                key = keys[src]
                idx.set(key.item() if isinstance(key, np.generic) else key, blk.id, row0, ts, True)
                if blk.id not in by_id:
                    by_id[blk.id] = blk
            elif inserts:
                ks: list[Any] = []
                arrays: list[np.ndarray] = []  # columnar batches' int64 keys
                bids: list[np.ndarray] = []
                rows: list[np.ndarray] = []
                for keys, src, blk, row0, n in inserts:
                    if isinstance(keys, np.ndarray):
                        arrays.append(keys[src : src + n])
                    else:
                        ks.extend(keys[src : src + n])
                    bids.append(np.full(n, blk.id, dtype=np.int64))
                    rows.append(np.arange(row0, row0 + n, dtype=np.int64))
                    if blk.id not in by_id:
                        by_id[blk.id] = blk
                allk: Any = ks
                if arrays:  # in the order of `inserts` (a key given twice takes its last)
                    if ks:
                        allk = [
                            k
                            for keys, src, _, _, n in inserts
                            for k in (
                                keys[src : src + n].tolist()
                                if isinstance(keys, np.ndarray)
                                else keys[src : src + n]
                            )
                        ]
                    else:
                        allk = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
                idx.set_many(allk, np.concatenate(bids), np.concatenate(rows), ts, True)
            if not deletes:
                return
            cur = idx.get_many([d[0] for d in deletes])
            dk: list[Any] = []
            db: list[int] = []
            dr: list[int] = []
            for (key, blk, row), e in zip(deletes, cur, strict=True):
                if e is None or (e[0] == blk.id and e[1] == row):
                    dk.append(key)
                    db.append(blk.id)
                    dr.append(row)
                    if blk.id not in by_id:
                        by_id[blk.id] = blk
                    if e is None:  # a flushed row's key (pruned): prune it again later
                        self.unpruned.setdefault(blk.id, []).append(key)
            idx.set_many(dk, db, dr, ts, False)

    def index_insert_rows(
        self, keys: Sequence[Any], blk: BlockNode, rows: Sequence[int], ts: Sequence[int]
    ) -> None:
        """`index_commit` of many transactions' inserts into one block at once, in commit
        order (replay): key keys[i] was written at row rows[i] of `blk` at ts[i]. The one
        place the bulk path touches the index."""
        if not (len(keys) == len(rows) == len(ts)):
            raise ValueError(f"block {blk.id}: {len(keys)} keys for {len(rows)} rows, {len(ts)} ts")
        bid = blk.id
        with self.index_lock:
            self.index.set_many(keys, bid, rows, ts, True)
            if bid not in self.by_id:
                self.by_id[bid] = blk

    def pk_cid(self) -> int:
        assert self.table is not None
        schema = self.table.schemas[-1][1]
        return schema.column(schema.primary_key).column_id

    def lookup_many(self, keys: Sequence[Any] | np.ndarray) -> dict[Any, list[Any]]:
        """key -> [block, row, last write ts, live] of each key's newest write (keys never
        written are absent): the index, else the flushed blocks (their key filters, then
        their key column and row ts). Entries are copies: read-only. `keys` may be an
        int64 array (a columnar batch's): then only the keys found cost Python work."""
        if isinstance(keys, np.ndarray):
            return self._lookup_array(keys)
        out: dict[Any, list[Any]] = {}
        check: list[Any] = []
        by_id = self.by_id
        for k, he in zip(keys, self.index.get_many(keys), strict=True):
            if he is None:
                check.append(k)
            else:
                out[k] = [by_id[he[0]], he[1], he[2], he[3]]
                if not he[3]:  # a delete: a newer live row may be in a flushed block
                    check.append(k)
        if not check or not len(self.flushed):
            return out
        self._merge_flushed(out, self._lookup_flushed(check))
        return out

    def _lookup_array(self, keys: np.ndarray) -> dict[Any, list[Any]]:
        """`lookup_many` of an int64 key array."""
        out: dict[Any, list[Any]] = {}
        hit, blk, row, ts, live = self.index.find_many(keys)
        check = ~hit
        if hit.any():
            by_id = self.by_id
            at = np.flatnonzero(hit)
            for k, b, r, t, lv in zip(
                keys[at].tolist(),
                blk[at].tolist(),
                row[at].tolist(),
                ts[at].tolist(),
                live[at].tolist(),
                strict=True,
            ):
                out[k] = [by_id[b], r, t, lv]
            check |= hit & ~live  # a delete: a newer live row may be in a flushed block
        if not len(self.flushed) or not check.any():
            return out
        self._merge_flushed(out, self._lookup_flushed(keys[check]))
        return out

    @staticmethod
    def _merge_flushed(out: dict[Any, list[Any]], flushed: dict[Any, list[Any]]) -> None:
        for k, fe in flushed.items():
            cur = out.get(k)
            if cur is None:
                out[k] = fe
            elif fe[3] and (fe[0] is not cur[0] or fe[1] != cur[1]) and fe[2] > cur[2]:
                out[k] = fe

    def _lookup_flushed(self, keys: list[Any] | np.ndarray) -> dict[Any, list[Any]]:
        reader = self.objects()
        if reader is None:
            return {}
        pk = self.pk_cid()
        m = filter_bits(BLOCK_ROWS, reader.bits_per_key)
        best: dict[Any, list[Any]] = {}
        found = self.flushed.candidates(keys, reader, pk, m)
        if not found:  # new keys of an ascending key (most inserts): no Python per key
            return best
        kl = keys.tolist() if isinstance(keys, np.ndarray) else keys
        groups: dict[int, tuple[BlockNode, list[Any]]] = {}
        for i, blk in found:
            if blk.delete_ts == MAX_TS and isinstance(blk.mem.cols, DroppedCols):
                groups.setdefault(blk.id, (blk, []))[1].append(kl[i])
        for blk, wanted in groups.values():  # one read of each per block, not per key
            mem = blk.mem
            cols = mem.cols
            assert isinstance(cols, DroppedCols)
            hits = reader.key_rows(cols.loc, pk, len(mem)).find(wanted)
            if not hits:
                continue  # false positives of the filter: one read, no answer
            cts = np.asarray(mem.cts[:], dtype=np.int64)  # cached by the reader
            dts = mem.dts  # by row: the deletes since the delta object are a dict
            for key, rows in hits:
                for r in rows:
                    c = int(cts[r])
                    if c >= ABORTED_TS:
                        continue
                    d = int(dts[r])
                    e = [blk, r, max(c, blk.create_ts), True] if d == MAX_TS else [blk, r, d, False]
                    cur = best.get(key)
                    if cur is None or (e[3] and not cur[3]) or (e[3] == cur[3] and e[2] > cur[2]):
                        best[key] = e
        return best

    def register_flushed(
        self, blk: BlockNode, flt: KeyFilter | None = None, keys: Any = None
    ) -> None:
        """blk is flushed (its rows are views over its objects): find its keys through its
        filter from now on. `keys`: the keys index entries may point at blk with (the
        next `prune` drops those entries)."""
        self.flushed.register(blk, flt)
        if keys is not None and len(keys):
            with self.index_lock:
                had = self.unpruned.get(blk.id)
                self.unpruned[blk.id] = keys if had is None else list(had) + list(keys)

    def prune(self, upto: int) -> int:
        """Drop the index entries of flushed rows written at or before `upto` (the caller
        passes min(checkpoint ts, oldest active StartTS)): lookups find them through the
        flushed blocks. The blocks looked at are those flushed since (`unpruned`) whose
        keys are behind a filter (or replaced: lookups skip them); the index drops their
        entries in one vectorised pass. An entry newer than `upto` stays, and its key in
        `unpruned`, for the next prune. Returns how many were dropped."""
        registered = self.flushed
        with self.index_lock:
            bids = []
            for bid in self.unpruned:
                b = self.by_id.get(bid)
                if b is not None and (
                    b.mem.flushed
                    and (
                        bid in registered.slot_of
                        or bid in registered.pending
                        or b.delete_ts != MAX_TS
                    )
                ):
                    bids.append(bid)
            dropped, kept = self.index.prune(bids, upto)
            for bid in bids:
                if bid in kept:
                    self.unpruned[bid] = kept[bid]
                else:
                    del self.unpruned[bid]
        self.flushed.forget_deleted(upto)
        return dropped
