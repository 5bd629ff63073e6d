"""One streamed read of a table version as of a ts (issue 33: a CN reads a table larger
than its memory).

A `Scan` is taken under the CN's lock (`TableState.scan`: the blocks alive at ts, the
in-memory rows and deletes, the schema at ts: references, nothing copied row by row) and
then read without it, so the CN keeps applying records while a reader writes out rows:

1. each flushed block, the ones already in the cache first (a table larger than the cache
   still finds those before the scan evicts them), is read from its objects batch by batch
   (`block_objects.visible_batches`: commit ts <= ts, minus the rows deleted at or before
   ts in its delta object or in memory);
2. then the in-memory rows (the tail not yet flushed) with commit ts <= ts, minus those
   deleted at or before ts and minus those met in step 1 (a block's rows committed
   between the BlockMeta's `drop_before_ts` and the checkpoint are in its object and
   still in memory);
3. every batch is projected onto the schema at ts (columns added later: null).

What is held at a time: one batch of one object (plus its compressed bytes), the block's
deletes, the cache (`[cn] cache_bytes`) and the in-memory tail the CN holds anyway. Rows
come in storage order (block by block); `collect` sorts them by primary key, as
`CN.snapshot` always answered.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from consumers.core.block_cache import BlockCache
from consumers.core.block_objects import NO_ROWS, visible_batches
from schemas.logtail import COMMIT_TS, ROW_ID, BlockMeta, make_row_id
from schemas.wal import TableSchema

OFFSET_BITS = make_row_id(1, 0).bit_length() - 1  # a row id: block id << OFFSET_BITS | offset


@dataclass
class Scan:
    ts: int
    table_schema: TableSchema
    schema: pa.Schema  # the batches' schema: the table's columns at ts
    blocks: list[BlockMeta]
    tail: list[pa.Table]  # in-memory inserts (any ts; cut at ts here)
    memory_deletes: dict[int, pa.Array]  # block id -> row ids deleted at or before ts
    cache: BlockCache
    rows: int = field(default=0, init=False)  # rows yielded so far

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self.batches()

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The table's rows as of `ts`, batch by batch (steps 1-3 of the module docstring)."""
        tail_ids = self._tail_ids_by_block()
        seen: list[pa.Array] = []
        order = sorted(self.blocks, key=lambda m: (not self.cache.holds(m.meta_loc), m.block_id))
        for meta in order:  # 1.
            mine = tail_ids.get(meta.block_id)
            for batch in visible_batches(self.cache, meta, self.ts, self.memory_deletes.get(meta.block_id, NO_ROWS)):
                if mine is not None:
                    ids = batch.column(ROW_ID)
                    seen.append(ids.filter(pc.is_in(ids, value_set=mine)))
                yield self._out(batch)
        dropped = [*self.memory_deletes.values(), *seen]  # 2.
        hidden = pa.concat_arrays(dropped) if dropped else NO_ROWS
        for table in self.tail:
            for batch in table.to_batches():
                mask = pc.less_equal(batch.column(COMMIT_TS), self.ts)
                if len(hidden):
                    mask = pc.and_(mask, pc.invert(pc.is_in(batch.column(ROW_ID), value_set=hidden)))
                rows = batch.filter(mask)
                if rows.num_rows:
                    yield self._out(rows)

    def collect(self) -> pa.Table:
        """Every batch in one table, sorted by primary key (`CN.snapshot`)."""
        table = pa.Table.from_batches(list(self.batches()), schema=self.schema)
        return table.sort_by([(self.table_schema.primary_key, "ascending")])

    def _tail_ids_by_block(self) -> dict[int, pa.Array]:
        """Block id -> row ids of the in-memory rows in that block (bounded by the tail)."""
        if not self.tail or not self.blocks:
            return {}
        ids = np.concatenate([t.column(ROW_ID).to_numpy() for t in self.tail]).astype(np.int64)
        flushed = np.array([m.block_id for m in self.blocks], dtype=np.int64)
        blocks = ids >> OFFSET_BITS
        ids, blocks = ids[np.isin(blocks, flushed)], blocks[np.isin(blocks, flushed)]
        return {int(b): pa.array(ids[blocks == b]) for b in np.unique(blocks)}

    def _out(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """3. The batch's rows with exactly the schema's columns (missing ones null)."""
        self.rows += batch.num_rows
        have = set(batch.schema.names)
        cols = [
            batch.column(f.name).cast(f.type) if f.name in have else pa.nulls(batch.num_rows, f.type)
            for f in self.schema
        ]
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)
