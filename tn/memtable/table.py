"""A table's in-memory data: its segments and blocks, and the primary-key index.

Appends reserve row ranges in the open block (opening new blocks/segments as
blocks fill up) under the table lock, so concurrent transactions append
without waiting for each other's commits. New segments/blocks are catalog
nodes with create@ = MAX_TS until the first transaction with rows in them
commits (that transaction logs their creation).

The primary-key index maps key -> [block, row, last_write_ts, live]: the newest
committed (or queued-to-commit) write of that key. It is updated in commit
order by the pipeline, and serves the write-write conflict check and
delete-by-key.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from tn.catalog.nodes import BlockNode, SegmentNode, TableNode
from tn.memtable.block import BLOCK_ROWS, MemBlock

SEGMENT_BLOCKS = 16

# (block, first row in block, first row in batch, row count)
Range = tuple[BlockNode, int, int, int]


class TableData:
    __slots__ = ("lock", "segments", "blocks", "index", "open_block", "_alloc", "table")

    def __init__(self, alloc_id: Callable[[], int]) -> None:
        self.lock = threading.Lock()
        self.segments: list[SegmentNode] = []
        self.blocks: list[BlockNode] = []
        self.index: dict[Any, list[Any]] = {}
        self.open_block: BlockNode | None = None
        self._alloc = alloc_id
        self.table: TableNode | None = None  # set by the catalog

    # -- live appends -------------------------------------------------------
    def append(self, columns: dict[int, list[Any]], n: int, cts: int) -> list[Range]:
        """Append n rows (as uncommitted, `cts` = MAX_TS) and return where they landed."""
        out: list[Range] = []
        src = 0
        with self.lock:
            while src < n:
                blk = self.open_block
                if blk is None or blk.mem.free == 0:
                    blk = self._new_block()
                take = min(n - src, blk.mem.free)
                start = blk.mem.write(columns, src, take, cts)
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
            cts_list = mem.cts
            for i in range(offset, end):
                if cts_list[i] != hole_ts:
                    raise ValueError(f"block {blk.id}: row {i} is already taken")
            size = len(mem)
            for cid, values in columns.items():
                col = mem.cols.get(cid)
                if col is None:
                    col = mem.cols[cid] = [None] * size
                col[offset:end] = values[src : src + n]
            for i in range(offset, end):
                cts_list[i] = cts

    def block_rows(self) -> list[tuple[BlockNode, int]]:
        """Snapshot of (block, row count) for readers."""
        with self.lock:
            return [(b, len(b.mem)) for b in self.blocks]

    # -- index ------------------------------------------------------------------
    def index_commit(
        self,
        inserts: list[tuple[Any, BlockNode, int]],
        deletes: list[tuple[Any, BlockNode, int]],
        ts: int,
    ) -> None:
        """Record a committing transaction's writes: its inserts in order, then its deletes."""
        idx = self.index
        for key, blk, row in inserts:
            idx[key] = [blk, row, ts, True]
        for key, blk, row in deletes:
            e = idx.get(key)
            if e is not None and e[0] is blk and e[1] == row:
                e[2] = ts
                e[3] = False
