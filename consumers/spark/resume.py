"""Where a Spark CN job resumes reading its topics, and whether those records still exist.

A job's query resumes from its checkpointLocation: Spark's offset log (`offsets/<batch>`)
holds the end offsets of each planned micro-batch, its commit log (`commits/<batch>`) the
batches that finished. The next batch starts at the end of the last committed one (a
planned but uncommitted batch is run again from there), or, with nothing committed, at the
query's starting offsets -- the progress's `start_offsets` for a job started from a
checkpoint, the topics' first records (0) otherwise.

Once the TN truncated a topic past that position (a checkpoint's DeleteRecords while the
job was stopped or behind), or retention did, the records between the position and the
topic's log start are gone: `lost_positions` finds them before a query is started, so the
job can start again from the newest checkpoint (`consumers.spark.job.start_query`) instead
of failing in its first micro-batch (failOnDataLoss) or, worse, skipping them.

Spark's offset log format (`v1`, a metadata line, then one JSON line per source; this job
has one source, whose offsets are `{topic: {"<partition>": next offset}}` for the kwal
source and the built-in Kafka source alike) is read here and nowhere else.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from consumers.spark.decode import BLOCK, COMMIT_TS, META, OFFSET, OP
from consumers.spark.progress import CHANGES, PROGRESS, Progress, TableProgress


def _batches(d: Path) -> list[int]:
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit())


def committed_offsets(checkpoint: str | Path) -> dict[str, int] | None:
    """topic -> next offset of partition 0 at the end of the last committed micro-batch in
    Spark's checkpointLocation `checkpoint` (None: no batch committed yet)."""
    ckpt = Path(checkpoint)
    committed = set(_batches(ckpt / "commits"))
    done = [b for b in _batches(ckpt / "offsets") if b in committed]
    if not done:
        return None
    path = ckpt / "offsets" / str(done[-1])
    lines = path.read_text().splitlines()
    if len(lines) < 3 or not lines[0].startswith("v"):
        raise ValueError(f"{path}: not a Spark offset log entry (expected v1, metadata, offsets)")
    try:
        offsets = json.loads(lines[2])
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: the source's offsets are not JSON: {e}") from e
    return {str(t): int(parts["0"]) for t, parts in offsets.items() if "0" in parts}


def resume_positions(
    checkpoint: str | Path, prog: Progress, topics: list[str]
) -> dict[str, int]:
    """topic -> the first offset the job's next micro-batch needs (see the module
    docstring). A topic a checkpoint's manifest does not list (-2, "earliest") needs offset
    0, as in `consumers.spark.bootstrap`: every record above the checkpoint's ts lies at or
    above the listed offset, and the TN truncates only listed topics, so a log start above
    0 there is retention's."""
    committed = committed_offsets(checkpoint)
    if committed is not None:
        return {t: committed[t] for t in topics if t in committed}
    starts = {t: max(o, 0) for t, o in prog.start_offsets.items() if t in topics}
    return {**{t: 0 for t in topics}, **starts}


def lost_positions(
    positions: Mapping[str, int], log_starts: Mapping[str, int]
) -> dict[str, tuple[int, int]]:
    """topic -> [position, log start): the records the job needs that were deleted."""
    return {
        t: (o, log_starts[t]) for t, o in sorted(positions.items()) if o < log_starts.get(t, 0)
    }


def discard_output(output: str | Path, checkpoint: str | Path, tables: list[str]) -> None:
    """Forget everything a job wrote, before it starts again from a checkpoint:

    1. the progress files (the commit: from here on the job has no state, and starts as a
       new one whichever step a crash interrupts);
    2. Spark's checkpointLocation (its offsets are unusable);
    3. the change log and each table's directories (its Delta tables, one per incarnation:
       `<db>.<table>` and `<db>.<table>@<table id>`; bootstrap).

    A reader holding the old progress fails on the missing files rather than reading a mix."""
    out = Path(output)
    shutil.rmtree(out / PROGRESS, ignore_errors=True)  # 1.
    shutil.rmtree(Path(checkpoint), ignore_errors=True)  # 2.
    shutil.rmtree(out / CHANGES, ignore_errors=True)  # 3.
    for name in tables:
        shutil.rmtree(out / name, ignore_errors=True)
        for later in out.glob(f"{name}@*"):
            shutil.rmtree(later, ignore_errors=True)


def discard_work(work: str | Path, checkpoint: str | Path, tables: list[str]) -> None:
    """Forget the work directory's state (not the Delta tables, which may share the
    directory): the progress files first (the commit), Spark's checkpointLocation, the
    change log, and each table's checkpoint and large-transaction rows
    (`<db>.<table>/bootstrap`, `<db>.<table>/large`). Before a job resumes from its Delta
    output (`consumers.spark.job_state`)."""
    from consumers.spark.bootstrap import BOOTSTRAP_DIR
    from consumers.spark.large_txn import LARGE_DIR

    out = Path(work)
    shutil.rmtree(out / PROGRESS, ignore_errors=True)
    shutil.rmtree(Path(checkpoint), ignore_errors=True)
    shutil.rmtree(out / CHANGES, ignore_errors=True)
    for name in tables:
        for sub in (BOOTSTRAP_DIR, LARGE_DIR):
            shutil.rmtree(out / name / sub, ignore_errors=True)


# -- where each topic resumes from the Delta output alone --------------------------------


def note_catalog(prog: Progress, catalog: pa.Table) -> None:
    """After a batch's catalog records (column `__offset`) were applied: the catalog
    topic's next offset to read."""
    if catalog.num_rows:
        top = pc.max(catalog.column(OFFSET)).as_py()
        if top is not None:
            prog.catalog_offset = max(prog.catalog_offset, int(top) + 1)


MAX_OFFSET_ENTRIES = 32  # per table (`note_offsets`): the progress and resume point stay small


def note_offsets(tp: TableProgress, batch_id: int, stats: pa.Table) -> None:
    """After a batch was applied to `tp` (its Delta tables included): record the batch's
    first offset and highest commit ts of the table's topic (a large transaction's rows
    count at their block's create ts), the next offset to read, and forget the batches
    whose records are all at or below `tp.delta_ts` (in Delta)."""
    offsets = stats.column(OFFSET) if stats.num_rows else None
    if offsets is not None and offsets.null_count < len(offsets):
        lo, hi = pc.min_max(offsets).values()
        high_ts = int(pc.max(stats.column(COMMIT_TS)).as_py() or 0)
        blocks = stats.filter(pc.equal(stats.column(OP), BLOCK)).column(META).to_pylist()
        for text in blocks:
            meta = json.loads(text) if text else {}
            if meta.get("large_txn"):
                high_ts = max(high_ts, int(meta.get("create_ts", 0)))
        tp.offsets.append([batch_id, int(lo.as_py()), high_ts])
        tp.next_offset = max(tp.next_offset, int(hi.as_py()) + 1)
    tp.offsets = [e for e in tp.offsets if e[2] > tp.delta_ts]
    if len(tp.offsets) > MAX_OFFSET_ENTRIES:  # e.g. a topic whose table waits: merge the
        # oldest two (the first offset of one, the higher ts of both: re-reads more, never less)
        (b, lo_offset, t1), (_, _, t2) = tp.offsets[:2]
        tp.offsets[:2] = [[b, lo_offset, max(t1, t2)]]


def resume_offset(prog: Progress, tp: TableProgress) -> int:
    """The offset of `tp`'s topic from which a job resuming from the Delta output alone
    re-reads it: the first record of the oldest batch that may hold a record above the
    table's `delta_ts` (the rest of such a batch is dropped by its ts), else the next
    offset to read, else where the job started (-2: the topic's first record)."""
    if tp.offsets:
        return min(e[1] for e in tp.offsets)
    if tp.next_offset:
        return tp.next_offset
    return prog.start_offsets.get(tp.topic, 0)


def catalog_resume_offset(prog: Progress) -> int:
    """The catalog topic's next offset to read (the catalog state covers every record
    below it)."""
    return prog.catalog_offset or prog.start_offsets.get(prog.catalog_topic, 0)
