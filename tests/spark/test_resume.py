"""Where a Spark CN job resumes (`consumers.spark.resume`), from a checkpointLocation laid
out as Spark writes it: the end of the last committed micro-batch, a planned but uncommitted
batch run again from there, the starting offsets while nothing is committed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from consumers.spark.progress import Progress
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
