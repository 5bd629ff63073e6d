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

from consumers.spark.progress import CHANGES, PROGRESS, Progress


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
    if prog.horizon:
        return {t: max(o, 0) for t, o in prog.start_offsets.items() if t in topics}
    return {t: 0 for t in topics}


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
