"""Which blocks of a table the scheduled compaction rewrites (issue 30, item 5).

Only blocks a compaction may rewrite count (`compaction.compactable`: flushed,
complete, columns dropped from memory). Of those, at snapshot ts:

- a block is *small* when it holds at most `small_rows` live rows (a merge's or a large
  transaction's output, or a block emptied by deletes): a table with at least
  `min_small_blocks` small blocks merges them into full blocks;
- a block is *tombstoned* when at least `tombstone_ratio` of the rows it stores are
  deleted: it is rewritten without them (its delta object goes away with it).

`plan` returns the blocks to rewrite together (at most `max_blocks`, oldest first), or
nothing. A plan's output never triggers the policy again by itself: it has no deleted
rows, and at most one of its blocks is small (min_small_blocks is at least 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infra.config import CompactionConfig, ConfigError
from tn.catalog.nodes import ABORTED_TS, MAX_TS, BlockNode, TableNode
from tn.checkpoint.compaction import compactable
from tn.memtable.flushed import loc_ts


@dataclass(frozen=True, slots=True)
class BlockStats:
    block: BlockNode
    stored: int  # rows committed at or before ts
    live: int  # of those, not deleted at ts

    @property
    def tombstone_ratio(self) -> float:
        return (self.stored - self.live) / self.stored if self.stored else 0.0


def block_stats(blk: BlockNode, ts: int) -> BlockStats:
    mem = blk.mem
    n = len(mem)
    if mem.flushed and ts >= loc_ts(blk.meta_loc):
        # counts, not rows: no object read per look (docs/memory.md)
        stored = mem.cts.present()
        return BlockStats(blk, stored, stored - mem.dts.deleted(ts))
    cts = np.array(mem.cts[:n], dtype=np.int64)
    dts = np.array(mem.dts[:n], dtype=np.int64)
    stored = (cts <= ts) & (cts < ABORTED_TS)
    return BlockStats(blk, int(stored.sum()), int((stored & (dts > ts)).sum()))


@dataclass(frozen=True)
class CompactionPolicy:
    small_rows: int = 2048
    min_small_blocks: int = 4
    tombstone_ratio: float = 0.5
    max_blocks: int = 64

    def __post_init__(self) -> None:
        if self.min_small_blocks < 2:
            raise ConfigError(
                f"compaction.min_small_blocks must be at least 2, got {self.min_small_blocks}"
            )
        if not 0.0 < self.tombstone_ratio <= 1.0:
            raise ConfigError(
                f"compaction.tombstone_ratio must be in (0, 1], got {self.tombstone_ratio}"
            )
        if self.max_blocks < 2 or self.small_rows < 0:
            raise ConfigError("compaction.max_blocks must be >= 2 and small_rows >= 0")

    @classmethod
    def from_config(cls, cfg: CompactionConfig) -> CompactionPolicy:
        return cls(cfg.small_rows, cfg.min_small_blocks, cfg.tombstone_ratio, cfg.max_blocks)

    def plan(self, table: TableNode, ts: int) -> list[BlockNode]:
        """The blocks of `table` to rewrite together at snapshot `ts` (empty: none)."""
        stats = [
            block_stats(b, ts)
            for b in list(table.mem.blocks)
            if b.delete_ts == MAX_TS and b.create_ts <= ts and compactable(b)
        ]
        small = [s for s in stats if s.live <= self.small_rows]
        dead = [s for s in stats if s.stored and s.tombstone_ratio >= self.tombstone_ratio]
        if len(small) < self.min_small_blocks and not dead:
            return []
        picked = {s.block.id: s.block for s in dead}
        if len(small) >= self.min_small_blocks:
            picked.update((s.block.id, s.block) for s in small)
        return [picked[i] for i in sorted(picked)][: self.max_blocks]
