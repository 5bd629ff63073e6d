"""Large transactions on the Spark CN (docs/large-transactions.md).

A large transaction's rows never travel on the logtail topic: its table topic carries one
BlockMeta per block it created (`BlockMeta.large_txn`), and the rows are in those blocks'
objects. Every other block meta needs no action here (its rows came as inserts before it;
see `consumers.spark.job`), these do:

1. among a batch's decoded control rows, the block metas of large-transaction blocks the
   table has not met before (`TableProgress.blocks`: a meta published again after a TN
   restart, or a later flush of the same block, is not new);
2. each block's object is read from the object store, one block at a time, and written
   into the table's change log as inserts at the block's create ts (LSN 0, offset -1, as
   the checkpoint's rows of `consumers.spark.bootstrap`), under
   `<db>.<table>/large/batch=<id>/block-<block id>.parquet`;
3. the caller lists that directory among the table's change directories, so the rows are
   part of the state from the batch on; a batch replayed after a crash writes the same
   files again (mode overwrite) before its progress file commits it.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from consumers.core.exceptions import BootstrapError
from consumers.spark.decode import BLOCK, INSERT, META, OP, as_change_rows, change_schema
from consumers.spark.progress import TableProgress
from infra.objectstore import ObjectStore
from schemas.logtail import COMMIT_TS, BlockMeta

LARGE_DIR = "large"


def with_commit_ts(rows: pa.Table, ts: int) -> pa.Table:
    """A large-transaction block object's rows with their commit ts: the block's create ts
    (the object holds 0, written before the commit; FORMAT.md 9). Also for the checkpoint's
    rows (`consumers.spark.bootstrap`)."""
    at = rows.schema.get_field_index(COMMIT_TS)
    return rows.set_column(at, COMMIT_TS, pa.array(np.full(rows.num_rows, ts, np.int64), pa.int64()))


def new_large_blocks(tp: TableProgress, stats: pa.Table) -> list[BlockMeta]:
    """Step 1: the large-transaction blocks of `stats` (a batch's control rows) that
    `tp` has not met, once each, in their order."""
    if not stats.num_rows:
        return []
    metas = stats.filter(pc.equal(stats.column(OP), BLOCK)).column(META).to_pylist()
    out: dict[int, BlockMeta] = {}
    for text in metas:
        meta = BlockMeta(**json.loads(text))
        if meta.large_txn and str(meta.block_id) not in tp.blocks:
            out.setdefault(meta.block_id, meta)
    return list(out.values())


def write_large_blocks(
    store: ObjectStore | None,
    output: str | Path,
    tp: TableProgress,
    batch_id: int,
    blocks: list[BlockMeta],
) -> tuple[str, int] | None:
    """Step 2: the blocks' rows as change rows; returns (the directory relative to
    `output`, the rows written), or None when there were none."""
    if not blocks:
        return None
    if store is None:
        raise BootstrapError(
            f"{tp.name}: a large transaction's rows are in the object store "
            f"({blocks[0].meta_loc}); give the job the object store the TN writes to"
        )
    rel = f"{tp.name}/{LARGE_DIR}/batch={batch_id}"
    out = Path(output) / rel
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    target = change_schema(tp.columns())
    written = 0
    for meta in blocks:
        try:
            rows = pq.read_table(io.BytesIO(store.get(meta.meta_loc)))
        except Exception as e:
            raise BootstrapError(
                f"{tp.name}: cannot read object {meta.meta_loc} of large-transaction block "
                f"{meta.block_id}: {type(e).__name__}: {e}"
            ) from e
        n = rows.num_rows
        rows = with_commit_ts(rows, meta.create_ts)
        change = as_change_rows(rows, INSERT, np.zeros(n, np.int64), np.full(n, -1, np.int64), target)
        pq.write_table(change, out / f"block-{meta.block_id}.parquet")
        written += n
        del rows, change
    return rel, written
