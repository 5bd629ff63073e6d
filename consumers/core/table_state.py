"""One table's state on a CN, rebuilt from its logtail (seed 001, Part 1).

What is kept:
- the schema history and the table's lifetime [create_ts, drop_ts) (from the
  catalog topic);
- in-memory rows: Arrow batches of inserts (`__row_id`, `__commit_ts`,
  columns) and a map of in-memory deletes row_id -> delete ts;
- object-storage blocks (from BlockMeta records): where their rows and
  deletes are, and from which ts they may replace in-memory rows;
- `blocks_with_memory_deletes`: the blocks that have deletes still in memory,
  so a read of a flushed block checks memory only when it must (seed 001,
  "更快读取");

One `TableState` is one *version* of a table (one table id): a table dropped
and created again under the same name is a new version, and reads at a ts
before the drop still see the old one. Watermarks and duplicate detection
belong to the topic (the name), so they live in the CN (`CNCore`).

A BlockMeta for a known block is applied once.

`scan(ts)` = (object blocks alive at ts + in-memory rows), rows with commit
ts <= ts, minus rows deleted at or before ts, projected onto the schema at ts,
streamed batch by batch (`consumers.core.scan`); `snapshot(ts)` collects it and
sorts by primary key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from consumers.core.block_cache import BlockCache
from consumers.core.exceptions import TableNotFoundError
from consumers.core.scan import Scan
from schemas.arrow_ipc import arrow_schema, ipc_to_table
from schemas.logtail import COMMIT_TS, ROW_ID, BlockMeta, Changes, row_block
from schemas.wal import TableSchema


@dataclass
class BlockObject:
    """A block in object storage; its rows are read through the CN's `BlockCache`."""

    meta: BlockMeta


@dataclass
class TableState:
    database: str
    name: str
    table_id: int = 0
    schemas: list[tuple[int, TableSchema]] = field(default_factory=list)  # (from ts, schema)
    create_ts: int = 0
    drop_ts: int = 0  # 0 = alive
    inserts: list[pa.Table] = field(default_factory=list)
    deletes: dict[int, int] = field(default_factory=dict)  # row_id -> delete ts
    blocks: dict[int, BlockObject] = field(default_factory=dict)
    blocks_with_memory_deletes: set[int] = field(default_factory=set)
    applied_changes: int = 0

    # -- applying --------------------------------------------------------

    def apply_changes(self, changes: Changes) -> None:
        """Apply one transaction's changes (the caller drops duplicates)."""
        if changes.inserts is not None:
            batch = ipc_to_table(changes.inserts)
            if batch.num_rows:
                self.inserts.append(batch)
        if changes.deletes is not None:
            dels = ipc_to_table(changes.deletes)
            for row_id, ts in zip(
                dels.column(ROW_ID).to_pylist(), dels.column(COMMIT_TS).to_pylist(), strict=True
            ):
                self.deletes[row_id] = ts
                self.blocks_with_memory_deletes.add(row_block(row_id))
        self.applied_changes += 1

    def apply_block_meta(self, meta: BlockMeta) -> None:
        """A block is in object storage: drop its in-memory rows and deletes older than
        `drop_before_ts` (later ones stay until the next flush, seed 001 "清理内存")."""
        old = self.blocks.get(meta.block_id)
        if old is not None and old.meta == meta:
            return
        self.blocks[meta.block_id] = BlockObject(meta)
        cutoff = meta.drop_before_ts
        kept: list[pa.Table] = []
        for batch in self.inserts:
            in_block = pc.equal(pc.shift_right(batch.column(ROW_ID), 16), meta.block_id)
            old_rows = pc.and_(in_block, pc.less(batch.column(COMMIT_TS), cutoff))
            if pc.any(old_rows).as_py():
                batch = batch.filter(pc.invert(old_rows))
            if batch.num_rows:
                kept.append(batch)
        self.inserts = kept
        if meta.delta_loc and meta.block_id in self.blocks_with_memory_deletes:
            stale = [r for r, ts in self.deletes.items() if row_block(r) == meta.block_id and ts < cutoff]
            for r in stale:
                del self.deletes[r]
            if not any(row_block(r) == meta.block_id for r in self.deletes):
                self.blocks_with_memory_deletes.discard(meta.block_id)

    # -- reading ---------------------------------------------------------

    def schema_at(self, ts: int) -> TableSchema:
        current: TableSchema | None = None
        for from_ts, schema in self.schemas:
            if from_ts <= ts:
                current = schema
        if current is None:
            raise TableNotFoundError(f"table {self.database}.{self.name} has no schema at ts {ts}")
        return current

    def alive_at(self, ts: int) -> bool:
        return self.create_ts <= ts and (self.drop_ts == 0 or ts < self.drop_ts)

    def rows_in_memory(self) -> int:
        """Rows this version holds in memory (inserts not yet dropped by a BlockMeta)."""
        return sum(b.num_rows for b in self.inserts)

    def scan(self, ts: int, cache: BlockCache) -> Scan:
        """A streamed read as of ts (`consumers.core.scan`); call it under the CN's lock,
        read the `Scan` without it."""
        if not self.alive_at(ts):
            raise TableNotFoundError(f"table {self.database}.{self.name} does not exist at ts {ts}")
        schema = self.schema_at(ts)
        by_block: dict[int, list[int]] = {}
        for r, t in self.deletes.items():
            if t <= ts:
                by_block.setdefault(row_block(r), []).append(r)
        return Scan(
            ts=ts,
            table_schema=schema,
            schema=arrow_schema(schema),
            blocks=[b.meta for b in self.blocks.values() if b.meta.alive_at(ts)],
            tail=list(self.inserts),
            memory_deletes={b: pa.array(rs, pa.int64()) for b, rs in by_block.items()},
            cache=cache,
        )

    def snapshot(self, ts: int, cache: BlockCache) -> pa.Table:
        """The whole table as of ts, sorted by primary key: the scan, collected."""
        return self.scan(ts, cache).collect()
