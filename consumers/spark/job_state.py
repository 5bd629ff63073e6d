"""The Spark CN job's resume point in its Delta output: `<output>/_kwal_job`, so that a job
with the same `--output` and an empty (or lost) work directory continues where the tables
are, with its batch ids continuing (docs/delta.md, "Resuming from the output alone").

`_kwal_job` is a Delta table of one row (`batch`, `app`, `state`), overwritten once per
micro-batch after every table's commit of that batch, with the same idempotent-write pair
as the tables (`txnAppId` = the job, `txnVersion` = the batch id): a batch replayed after a
crash writes it once. The driver writes and reads it with delta-rs (`write_job_state`):
one small commit, no Spark job. `state` is the job's progress reduced to what does not live in the
work directory (`resume_point`): the catalog (incarnations, schemas, the catalog
watermark) and the catalog topic's next offset, per table its `delta_ts` (every change
at or below it is in Delta), the incarnation being written, and the offset of its topic to
re-read from (the first record of the oldest batch that may hold a change above
`delta_ts`: `consumers.spark.resume.resume_offset`).

Resuming (`restore_progress`), with M the batch `_kwal_job` records:

1. the work directory's own state is dropped (`consumers.spark.resume.discard_work`:
   progress, Spark checkpoint, change log);
2. the catalog and each topic resume from M's offsets (Spark's startingOffsets); the
   catalog state is M's, which covers exactly the catalog records below its offset;
3. Delta has no transaction across tables, so a crash in batch M+1 may have left some
   tables with M+1 committed (never further: M+2 starts after `_kwal_job` records M+1).
   The tables win: each table's `delta_ts` is raised to the newest watermark its Delta
   tables record (every incarnation's, `kwal.dropped_ts` marking an ended one), so the
   re-read records at or below it are dropped (`BatchWriter._to_delta` keeps changes above
   `delta_ts` only) and a version never claims a watermark below its table's last one
   (`delta_sink.merge_batch` skips such a commit: it would carry no change);
4. the restored progress is written to `_kwal_job` as batch M+1 (an id `_kwal_job` has
   not recorded: M+1 was the interrupted batch), then to the work directory; the job's batch
   ids continue at M+2 (`Progress.batch_base`), above every batch id any table or
   interval-changes table recorded, so no Delta write of the resumed job is skipped as a
   replay of a batch it did not run. Resumed again (its work directory lost again before
   its next batch), it starts from M+1, at M+3.

A job started from a checkpoint (`consumers.spark.bootstrap`) whose checkpoint rows are
still only in the lost work directory cannot resume (BootstrapError, named).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from consumers.core.exceptions import BootstrapError
from consumers.spark.delta_rs import rs_location
from consumers.spark.delta_sink import (
    APP_KEY,
    BATCH_KEY,
    WATERMARK_KEY,
    OutputOwnerError,
    _history_metadata,
    incarnation_path,
)
from consumers.spark.progress import Progress
from consumers.spark.resume import catalog_resume_offset, resume_offset

JOB_STATE = "_kwal_job"


def job_state_path(output: str) -> str:
    return f"{output.rstrip('/')}/{JOB_STATE}"


def resume_point(prog: Progress) -> Progress:
    """What `_kwal_job` records of `prog` (the progress after its batch): the work
    directory's parts dropped, each table's watermark at its `delta_ts` and the topics'
    positions to resume from in `start_offsets`."""
    point = copy.deepcopy(prog)
    point.start_offsets = {prog.catalog_topic: catalog_resume_offset(prog)}
    point.catalog_offset = point.start_offsets[prog.catalog_topic]
    for tp in point.tables.values():
        point.start_offsets[tp.topic] = resume_offset(prog, tp)
        tp.watermark = tp.delta_watermark = tp.delta_ts
        tp.pending, tp.pending_columns, tp.pending_ts = [], [], (0, 0)
        tp.change_rows = tp.uncompacted = tp.delta_changes = tp.delta_deletes = 0
        tp.delta_change_ts = 0
        tp.blocks = {}  # large transactions met again on the re-read are read again
        tp.change_dirs, tp.offsets, tp.next_offset = [], [], 0
        tp.state_batch = None
    return point


def write_job_state(spark: Any, output: str, app_id: str, prog: Progress) -> None:
    """Overwrite `_kwal_job` with `resume_point(prog)` (txnVersion = the batch id: a replay
    writes nothing). A job whose progress predates offset tracking writes none.

    Written by the driver with delta-rs (`consumers.spark.delta_rs`), not as a Spark job:
    the same Delta table, commit and idempotent-write pair (a `txn` action with the app id
    and the batch id, which Spark's Delta reads as its own `txnAppId`/`txnVersion`), in
    10-30 ms where Spark's one-row overwrite took 1.2 s (docs/perf-spark.md). Delta-rs
    records the pair but does not check it: a batch id at or below the one the table
    records is skipped here, as Spark's Delta would."""
    if not prog.offsets_known:
        return
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from deltalake.exceptions import TableNotFoundError

    uri, options = rs_location(spark, job_state_path(output))
    target: str | DeltaTable = uri
    try:
        target = DeltaTable(uri, storage_options=options)
    except TableNotFoundError:
        pass  # the first resume point creates the table
    txns = None
    if prog.batch_id >= 0:  # a new job's first resume point (-1) has no batch to repeat
        done = target.transaction_version(app_id) if isinstance(target, DeltaTable) else None
        if done is not None and done >= prog.batch_id:
            return
        txns = [Transaction(app_id, prog.batch_id)]
    state = json.dumps(resume_point(prog).to_json(), sort_keys=True)
    row = pa.table({
        "batch": pa.array([prog.batch_id], pa.int64()),
        "app": pa.array([app_id], pa.string()),
        "state": pa.array([state], pa.string()),
    })
    meta = json.dumps({BATCH_KEY: prog.batch_id, APP_KEY: app_id})
    write_deltalake(
        target, row, mode="overwrite", storage_options=options or None,
        commit_properties=CommitProperties(custom_metadata={"userMetadata": meta}, app_transactions=txns),
    )


def delete_job_state(spark: Any, output: str) -> None:
    """Remove `_kwal_job` (a job starting again from a checkpoint forgets its output)."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(job_state_path(output))
    path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).delete(path, True)


def read_job_state(spark: Any, output: str, app_id: str) -> Progress | None:
    """The resume point `_kwal_job` under `output` records (None: there is none). Refuses
    one another job wrote (another `txnAppId`: its batch ids are not this job's). Read with
    delta-rs (no Spark job: part of every query's start)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    path = job_state_path(output)
    uri, options = rs_location(spark, path)
    try:
        rows = DeltaTable(uri, storage_options=options).to_pyarrow_table().to_pylist()
    except TableNotFoundError:
        return None
    if len(rows) != 1:
        raise ValueError(f"{path}: the job's resume point has {len(rows)} rows, expected 1")
    row = rows[0]
    if row["app"] != app_id:
        raise OutputOwnerError(
            f"{path}: written by another job (txnAppId {row['app']}, up to its batch "
            f"{row['batch']}), not this one ({app_id}): point the job at a new --output"
        )
    state = Progress.from_json(json.loads(row["state"]))
    state.offsets_known = True
    return state


def restore_progress(spark: Any, output: str, state: Progress) -> Progress:
    """Steps 2-4 of the module docstring: the progress a job with no work directory starts
    from, given the resume point `state` (batch M) and the Delta tables under `output`."""
    from consumers.spark.delta_reader import incarnation_paths

    prog = copy.deepcopy(state)
    for name, tp in prog.tables.items():
        newest = _newest_commits(spark, incarnation_paths(spark, output, name) if _exists(spark, output) else [])
        for meta in newest.values():
            if WATERMARK_KEY in meta:
                tp.delta_ts = max(tp.delta_ts, int(meta[WATERMARK_KEY]))
            elif "kwal_dropped_ts" in meta:
                tp.delta_ts = max(tp.delta_ts, int(meta["kwal_dropped_ts"]) - 1)
        # every change at or below delta_ts is in Delta: the topic is re-read above it
        tp.watermark = tp.delta_watermark = tp.delta_ts
        for number, inc in enumerate(tp.incarnations):  # ended in Delta, maybe after M
            if inc.create_ts < tp.delta_create_ts:
                continue
            path = incarnation_path(output, name, number, inc.table_id)
            if "kwal_dropped_ts" not in newest.get(path, {}):
                break
            tp.delta_create_ts = inc.create_ts + 1
        if prog.horizon and tp.delta_ts < prog.horizon and any(
            i.alive_at(prog.horizon) for i in tp.incarnations
        ):
            raise BootstrapError(
                f"{name}: the job started from the checkpoint at ts {prog.horizon} and its rows "
                f"there are not in {output} yet (they were in the lost work directory): start the "
                "job on a new --output, or delete this one"
            )
    prog.batch_id = state.batch_id + 1
    prog.batch_base = state.batch_id + 2
    prog.committed_at = 0.0
    return prog


def _exists(spark: Any, output: str) -> bool:
    jvm = spark.sparkContext._jvm
    root = jvm.org.apache.hadoop.fs.Path(output)
    return bool(root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).exists(root))


def _newest_commits(spark: Any, paths: list[str]) -> dict[str, dict[str, Any]]:
    """path -> the userMetadata of its newest commit carrying a kwal batch id."""
    out: dict[str, dict[str, Any]] = {}
    for path in paths:
        for meta in _history_metadata(spark, path, limit=2):
            if BATCH_KEY in meta:
                out[path] = meta
                break
    return out
