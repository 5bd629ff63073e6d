"""How a CN reads one flushed block from object storage: the one place in `consumers.core`
that knows the objects' layout (written by `tn/checkpoint/runner.py`, described in
`tn/checkpoint/dump.py`), so that a change of how objects store per-row timestamps lands
here only.

Today's layout: the block object holds `__row_id`, `__commit_ts` and the table's columns
of every row committed up to the checkpoint (deleted ones too; a large transaction's block
has commit ts 0: its rows are visible from the block's create ts, `BlockMeta.alive_at`);
the delta object holds `__row_id`, `__commit_ts` (= the delete ts) of the block's rows
deleted up to the checkpoint. Both are read through the CN's `BlockCache`, batch by batch.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from consumers.core.block_cache import BlockCache
from schemas.logtail import COMMIT_TS, ROW_ID, BlockMeta

NO_ROWS = pa.array([], pa.int64())


def deleted_rows(cache: BlockCache, meta: BlockMeta, ts: int, memory_deletes: pa.Array = NO_ROWS) -> pa.Array:
    """Row ids of the block deleted at or before ts: its delta object's, plus
    `memory_deletes` (those still in the CN's memory, already cut at ts)."""
    parts = [memory_deletes] if len(memory_deletes) else []
    if meta.delta_loc:
        for batch in cache.batches(meta.delta_loc):
            gone = batch.filter(pc.less_equal(batch.column(COMMIT_TS), ts)).column(ROW_ID)
            if len(gone):
                parts.append(gone)
    if not parts:
        return NO_ROWS
    return pa.concat_arrays([p.cast(pa.int64()) for p in parts])


def visible_batches(
    cache: BlockCache, meta: BlockMeta, ts: int, memory_deletes: pa.Array = NO_ROWS
) -> Iterator[pa.RecordBatch]:
    """The block's rows visible at ts (committed at or before it and not deleted at or
    before it), as record batches of the block object's columns; nothing when the block
    is not part of its table at ts."""
    if not meta.alive_at(ts):
        return
    deleted = deleted_rows(cache, meta, ts, memory_deletes)
    for batch in cache.batches(meta.meta_loc):
        mask = pc.less_equal(batch.column(COMMIT_TS), ts)
        if len(deleted):
            mask = pc.and_(mask, pc.invert(pc.is_in(batch.column(ROW_ID), value_set=deleted)))
        rows = batch.filter(mask)
        if rows.num_rows:
            yield rows
