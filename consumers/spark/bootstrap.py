"""A fresh Spark CN job starts from the newest checkpoint (seed 001, "拉取"/pull).

The TN truncates logtail topics after checkpoints (physically where the broker has
DeleteRecords), so a job that builds each table from its topic's first record cannot start
once that happened. `bootstrap_output` starts it from the object store instead, the way
`consumers.core.cn.CN` does, and writes what it found as the job's first commit:

1. read the newest manifest and the catalog snapshot it names (`BootstrapError` when there
   is none, or it cannot be read);
2. each job table alive at the checkpoint's ts t1 gets its incarnation from the snapshot
   (create ts, table id, schema history) and watermark t1; a table not alive at t1 starts
   with none (its create_table, later than t1, comes on the catalog topic);
3. each alive table's rows at t1 go into its change log as batch -1, under
   `<db>.<table>/bootstrap/`: per block alive at t1, one Parquet file with the rows of its
   data object (commit ts <= t1) as inserts and one with its delta object's deletes (ts <=
   t1), read and written one object at a time;
4. the progress file `_progress/bootstrap.json` is written last (atomic rename): the
   commit. It carries the horizon t1 and the positions to start the topics from: the
   manifest's logtail offsets (every record with commit ts > t1 lies at or above them;
   `tn.logtail.publisher`), earliest for a topic the manifest does not list (a table whose
   first record came after the checkpoint).

A crash before step 4 leaves nothing the job reads: the next start bootstraps again and
replaces `bootstrap/`. After it, the job is an ordinary one whose change log starts with
batch -1: records at or below t1 met on the topics are dropped when decoded
(`DecodePlan.horizon`), and `read_as_of` below t1 raises `BelowHorizonError` -- the objects
hold the state at t1, not the history before it.
"""

from __future__ import annotations

import io
import logging
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from consumers.core.cn import newest_checkpoint
from consumers.core.exceptions import BootstrapError, TruncatedLogtailError
from consumers.spark.decode import (
    DELETE,
    INSERT,
    as_change_rows,
    block_meta_json,
    change_schema,
    union_columns,
)
from consumers.spark.large_txn import with_commit_ts
from consumers.spark.progress import Incarnation, Progress, TableProgress, write_progress
from infra.objectstore import ObjectStore
from schemas.logtail import COMMIT_TS
from tn.checkpoint.manifest import CatalogSnapshot, Manifest, schema_in

log = logging.getLogger(__name__)

BOOTSTRAP_BATCH = -1  # the change-log batch id of the checkpoint's rows
BOOTSTRAP_DIR = "bootstrap"


def bootstrap_output(
    store: ObjectStore,
    output: str | Path,
    catalog_topic: str,
    table_topics: Mapping[str, str],
    lows: Mapping[str, int],
) -> Progress:
    """Steps 1-4 of the module docstring for a job with no progress yet under `output`;
    returns the progress committed. `table_topics`: db.table -> its logtail topic; `lows`:
    topic -> the first offset it still has. Before committing, every start position must
    still exist: TruncatedLogtailError otherwise (a newer checkpoint truncated the topics
    meanwhile; starting again picks it up)."""
    newest = newest_checkpoint(store)  # 1.
    if newest is None:
        raise BootstrapError(
            "the object store holds no checkpoint to start from (the TN writes one every "
            "checkpoint interval; `kwal checkpoint list` shows them)"
        )
    manifest, snapshot = newest
    t1 = snapshot.ts
    alive = snapshot.tables_alive(table_topics)
    prog = Progress(
        batch_id=BOOTSTRAP_BATCH,
        catalog_topic=catalog_topic,
        catalog_watermark=t1,
        horizon=t1,
        start_offsets=start_offsets(manifest, [catalog_topic, *table_topics.values()]),
    )
    starts = {t: max(o, 0) for t, o in prog.start_offsets.items()}  # -2: its first record
    gone = {t: (o, lows[t]) for t, o in starts.items() if o < lows.get(t, 0)}
    if gone:
        where = "; ".join(
            f"{t}[0] starts at {low}, past offset {o} where the job must begin"
            for t, (o, low) in sorted(gone.items())
        )
        raise TruncatedLogtailError(
            f"{where}: records after checkpoint ts {t1} were deleted since it was taken (a "
            "newer checkpoint's truncation, or retention); start again to use the newest one"
        )
    for index, (name, topic) in enumerate(table_topics.items()):
        tp = prog.tables[name] = TableProgress(name, topic, index=index)
        entry = alive.get(name)
        if entry is None:
            continue  # 2. not alive at t1
        schemas = [(int(ts), schema_in(s)) for ts, s in entry["schemas"]]
        tp.incarnations.append(Incarnation(int(entry["create_ts"]), int(entry["id"]), 0, schemas))
        tp.watermark = t1
        tp.state_create_ts = tp.incarnations[0].create_ts  # the state starts from batch -1
        rows, tp.blocks = write_table_rows(store, snapshot, entry, Path(output) / name)  # 3.
        if rows:
            tp.change_dirs.append([BOOTSTRAP_BATCH, f"{name}/{BOOTSTRAP_DIR}", ""])
            tp.change_rows = tp.uncompacted = rows
    write_progress(output, prog)  # 4.
    log.info(
        "Spark CN: started from checkpoint %s (ts %d): %s",
        manifest.catalog,
        t1,
        ", ".join(f"{n} {prog.tables[n].change_rows} rows" for n in alive) or "no table alive",
    )
    return prog


def change_rows(objects: pa.Table, op: str, t1: int, target: pa.Schema) -> pa.Table:
    """An object's rows with commit ts <= t1 as change rows of `target` (`change_schema`):
    op `op`, LSN 0 and offset -1 (they come from no Kafka record), user columns projected
    (missing ones null: a block written before an ALTER TABLE)."""
    rows = objects.filter(pc.less_equal(objects.column(COMMIT_TS), t1))
    n = rows.num_rows
    return as_change_rows(rows, op, np.zeros(n, np.int64), np.full(n, -1, np.int64), target)


def write_table_rows(
    store: ObjectStore, snapshot: CatalogSnapshot, entry: dict, table_dir: Path
) -> tuple[int, dict[str, str]]:
    """Step 3 for one table: its change-log files under `table_dir/bootstrap/`; returns the
    number of change rows written and its blocks' metas (block id -> JSON)."""
    t1 = snapshot.ts
    cols = union_columns(schema_in(s) for _, s in entry["schemas"])
    target = change_schema(cols)
    out = table_dir / BOOTSTRAP_DIR
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    written, metas = 0, {}
    for block in snapshot.blocks:
        meta = block.block_meta()
        if block.table_id != entry["id"] or not meta.meta_loc or not meta.alive_at(t1):
            continue
        metas[str(block.id)] = block_meta_json(meta)
        for op, key in ((INSERT, block.meta_loc), (DELETE, block.delta_loc)):
            if not key:
                continue
            try:
                objects = pq.read_table(io.BytesIO(store.get(key)))
            except Exception as e:
                raise BootstrapError(
                    f"cannot read object {key} of block {block.id} (checkpoint ts {t1}): "
                    f"{type(e).__name__}: {e}"
                ) from e
            if op == INSERT and meta.large_txn:
                objects = with_commit_ts(objects, meta.create_ts)
            rows = change_rows(objects, op, t1, target)
            if rows.num_rows:
                pq.write_table(rows, out / f"block-{block.id}-{op}.parquet")
                written += rows.num_rows
    return written, metas


def start_offsets(manifest: Manifest, topics: Iterable[str]) -> dict[str, int]:
    """Step 4's positions: topic -> offset of its partition 0 (the logtail topics have one),
    -2 (earliest) for a topic the manifest does not list."""
    return {topic: int(manifest.logtail_offsets.get(topic, -2)) for topic in topics}
