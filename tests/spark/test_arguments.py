"""`kwal cn spark` and `spark-submit consumers/spark/job.py` take the same job arguments,
declared once (`consumers.spark.arguments`), and `kwal` loads no Spark or pyarrow for it."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from consumers.spark import job
from ops import cli

ARGV = [
    "--tables", "db.a,db.b", "--output", "/tmp/out", "--trigger", "available-now",
    "--max-records-per-trigger", "500", "--compact-interval", "2.5", "--timeout", "30",
    "--from-checkpoint", "never",
]
JOB_KEYS = (
    "tables", "output", "trigger", "checkpoint", "max_records_per_trigger", "compact_interval",
    "timeout", "master", "from_checkpoint",
)


def test_both_entry_points_parse_the_job_arguments_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(job, "run", lambda args, cfg: seen.append(args) or 0)
    assert job.main([*ARGV, "--bootstrap", "127.0.0.1:1"]) == 0
    submitted = vars(seen[0])
    kwal = vars(cli.build_parser().parse_args(["cn", "spark", *ARGV]))
    assert {k: kwal[k] for k in JOB_KEYS} == {k: submitted[k] for k in JOB_KEYS}
    assert kwal["from_checkpoint"] == "never" and kwal["compact_interval"] == 2.5
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["cn", "spark", *ARGV[:4], "--from-checkpoint", "sometimes"])


def test_the_kwal_command_line_loads_no_spark_nor_pyarrow() -> None:
    code = (
        "import sys, ops.cli; ops.cli.build_parser(); "
        "print(sorted(m for m in ('pyarrow', 'pyspark', 'consumers.spark.job') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
