"""Where a Spark CN job resumes (`consumers.spark.resume`), from a checkpointLocation laid
out as Spark writes it: the end of the last committed micro-batch, a planned but uncommitted
batch run again from there, the starting offsets while nothing is committed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from consumers.spark.progress import PROGRESS, Progress
from consumers.spark.resume import committed_offsets, lost_positions, resume_positions

META = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})


def _batch(ckpt: Path, n: int, offsets: dict[str, int], committed: bool) -> None:
    (ckpt / "offsets").mkdir(parents=True, exist_ok=True)
    (ckpt / "commits").mkdir(parents=True, exist_ok=True)
    line = json.dumps({t: {"0": o} for t, o in offsets.items()})
    (ckpt / "offsets" / str(n)).write_text(f"v1\n{META}\n{line}")
    (ckpt / "offsets" / f".{n}.crc").write_text("crc")
    if committed:
        (ckpt / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_the_next_batch_starts_at_the_end_of_the_last_committed_one(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    topics = ["cat", "t"]
    assert committed_offsets(ckpt) is None
    # nothing committed: the starting offsets (0, or a checkpoint's; -2, unlisted, is 0)
    assert resume_positions(ckpt, Progress(), topics) == {"cat": 0, "t": 0}
    started = Progress(horizon=5, start_offsets={"cat": 7, "t": -2})
    assert resume_positions(ckpt, started, topics) == {"cat": 7, "t": 0}
    _batch(ckpt, 0, {"cat": 10, "t": 20}, committed=True)
    _batch(ckpt, 1, {"cat": 12, "t": 30}, committed=True)
    _batch(ckpt, 2, {"cat": 15, "t": 40}, committed=False)  # planned, run again from batch 1's end
    assert committed_offsets(ckpt) == {"cat": 12, "t": 30}
    assert resume_positions(ckpt, started, topics) == {"cat": 12, "t": 30}
    assert lost_positions({"cat": 12, "t": 30}, {"cat": 12, "t": 31}) == {"t": (30, 31)}
    assert lost_positions({"cat": 12, "t": 30}, {"cat": 0, "t": 30}) == {}


def test_an_offset_log_entry_spark_did_not_write_is_refused(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _batch(ckpt, 0, {"t": 1}, committed=True)
    (ckpt / "offsets" / "0").write_text("v1\nnot json either\n{oops")
    with pytest.raises(ValueError, match="offsets are not JSON"):
        committed_offsets(ckpt)
    (ckpt / "offsets" / "0").write_text("garbage")
    with pytest.raises(ValueError, match="not a Spark offset log entry"):
        committed_offsets(ckpt)


def test_a_tables_resume_offset_is_its_oldest_batch_with_a_change_above_delta_ts() -> None:
    """Where a job resuming from its Delta output alone re-reads a table's topic
    (`note_offsets`, `resume_offset`): the first offset of the oldest batch that brought a
    record above the table's delta_ts (a large transaction's rows count at their block's
    create ts), else the next offset, else the job's start offset."""
    import json

    import pyarrow as pa

    from consumers.spark.decode import BLOCK, COMMIT_TS, HEARTBEAT, INSERT, META, OFFSET, OP
    from consumers.spark.progress import TableProgress
    from consumers.spark.resume import note_offsets, resume_offset

    def stats(rows: list[tuple[str, int, int, str | None]]) -> pa.Table:
        ops, ts, offs, metas = zip(*rows, strict=True)
        return pa.table({OP: list(ops), COMMIT_TS: list(ts), META: list(metas), OFFSET: list(offs)},
                        schema=pa.schema([(OP, pa.string()), (COMMIT_TS, pa.int64()),
                                          (META, pa.string()), (OFFSET, pa.int64())]))

    prog = Progress(catalog_topic="cat", start_offsets={"t.a": 7})
    tp = TableProgress("db.a", "t.a")
    assert resume_offset(prog, tp) == 7  # nothing read yet: where the job started
    tp.delta_ts = 10
    note_offsets(tp, 0, stats([(INSERT, 9, 7, None), (HEARTBEAT, 10, 8, None)]))
    assert (tp.offsets, tp.next_offset, resume_offset(prog, tp)) == ([], 9, 9)  # all in Delta
    note_offsets(tp, 1, stats([(INSERT, 11, 9, None), (INSERT, 12, 10, None)]))
    large = json.dumps({"block_id": 3, "large_txn": True, "create_ts": 20})
    note_offsets(tp, 2, stats([(BLOCK, 13, 11, large)]))
    assert tp.offsets == [[1, 9, 12], [2, 11, 20]] and resume_offset(prog, tp) == 9
    tp.delta_ts = 13  # batch 1 is in Delta, batch 2's large transaction (ts 20) is not
    note_offsets(tp, 3, stats([(HEARTBEAT, 14, 12, None)]))
    assert tp.offsets == [[2, 11, 20], [3, 12, 14]] and resume_offset(prog, tp) == 11
    tp.delta_ts = 20
    note_offsets(tp, 4, stats([(HEARTBEAT, 20, 13, None)]))
    assert (tp.offsets, resume_offset(prog, tp)) == ([], 14)
    # a table whose Delta waits (no delta_ts move) keeps a bounded list, from its oldest offset
    for b in range(5, 60):
        note_offsets(tp, b, stats([(INSERT, 20 + b, 100 + b, None)]))
    assert len(tp.offsets) <= 32 and resume_offset(prog, tp) == 105
    assert max(e[2] for e in tp.offsets) == 79


def test_a_job_starting_again_from_a_checkpoint_discards_its_delta_tables(
    spark: Any, tmp_path: Path
) -> None:
    """`discard_job` (a job that fell behind the truncation starts again from a
    checkpoint) with a local `--output` beside its `--work-dir`: the Delta tables of its
    tables go, every incarnation (a table left behind would keep rows the checkpoint no
    longer has), with the resume point and the work directory's state; another job's
    table under the same output stays. (An output that is the work directory:
    tests/lifecycle/test_cn_behind.py.)"""
    import pyarrow as pa
    from deltalake import write_deltalake

    from consumers.spark.job import discard_job
    from consumers.spark.job_state import JOB_STATE

    work, output = tmp_path / "work", tmp_path / "delta"
    for name in ("db.a", "db.a@7", "db.b", "db.c", JOB_STATE):
        write_deltalake(str(output / name), pa.table({"id": [1]}))  # Delta tables, no Spark job
    (work / PROGRESS).mkdir(parents=True)
    ckpt = work / "_checkpoint"
    ckpt.mkdir()
    discard_job(spark, str(output), work, ckpt, ["db.a", "db.b"])
    assert sorted(p.name for p in output.iterdir()) == ["db.c"]
    assert not (work / PROGRESS).exists() and not ckpt.exists()
