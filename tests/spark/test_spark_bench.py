"""`kwal bench spark`'s figures, on a small load, the session's broker and the shared
SparkSession (its `run` stops the session it builds, so the test calls `bench`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from consumers.spark.arguments import DEFAULT_SOURCE
from infra.config import KwalConfig
from ops.bench.report import emit
from ops.bench.spark import bench, faster_source

pytestmark = pytest.mark.spark


def test_bench_spark_prints_one_json_line_with_both_sides(
    spark: Any, kwal_config: KwalConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    emit(bench(spark, kwal_config, rows=2000, rows_per_txn=10, samples=2, warmups=1))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["rows"] == 2000 and result["records"] == 201
    assert result["rows_per_s"] > 0 and result["raw_rows_per_s"] > 0
    assert result["vs_raw"] == pytest.approx(result["rows_per_s"] / result["raw_rows_per_s"], abs=0.01)
    assert result["batches"] >= 1
    assert result["warmups"] == 1
    assert result["jvm_cpu_s"] is not None and result["jvm_cpu_s"] > 0  # the shared local JVM
    assert result["watermark"] > 0
    assert result["latency_samples"] == 2
    assert 0 < result["latency_p50_ms"] <= result["latency_p99_ms"] <= result["latency_max_ms"]
    assert (result["sink"], result["source"]) == ("delta", DEFAULT_SOURCE)
    # both sources measured on the same topic in this run, the job's default reported as
    # rows_per_s
    named = {"kwal": "python_source", "builtin": "builtin"}
    for name in named.values():
        assert result[f"rows_per_s_{name}"] > 0
        assert result[f"batch_rows_per_s_{name}"] >= result[f"rows_per_s_{name}"]
        assert result[f"jvm_cpu_s_{name}"] > 0
        assert result[f"tree_cpu_s_{name}"] > 0  # the driver, the JVM, its Python workers
    mine = named[DEFAULT_SOURCE]
    assert result["rows_per_s"] == result[f"rows_per_s_{mine}"]
    assert result["spark_s"] == result[f"spark_s_{mine}"]
    assert 0 < result["first_batch_s"] < result["spark_s"]
    speeds = {s: result[f"rows_per_s_{named[s]}"] for s in named}
    if speeds["kwal"] == speeds["builtin"]:
        assert result["faster"] == "tie"
    else:
        assert result["faster"] == max(speeds, key=lambda s: speeds[s])


def test_faster_names_the_quicker_source_and_a_tie_as_one() -> None:
    """Figures rounded to whole rows a second can be equal (CI run w9): neither source is
    then named, whatever order they were measured in."""
    assert faster_source({"builtin": {"rows_per_s": 430}, "kwal": {"rows_per_s": 435}}) == "kwal"
    assert faster_source({"kwal": {"rows_per_s": 435}, "builtin": {"rows_per_s": 440}}) == "builtin"
    assert faster_source({"builtin": {"rows_per_s": 435}, "kwal": {"rows_per_s": 435}}) == "tie"
    assert faster_source({"kwal": {"rows_per_s": 435}, "builtin": {"rows_per_s": 435}}) == "tie"
