"""The README's main job, `kwal demo`, end to end as a user runs it: its own process, on
the session's Apache Kafka and S3 server (a configured broker: the demo starts no stack of
its own), with the TN killed and restarted mid-load and the Spark CN job writing Delta
tables. It must end with exit code 0 and every CN agreeing with the TN rebuilt from its WAL.

Marked slow: it costs about a minute (two TN starts, a JVM, the job), which the CI run's
10 minutes on 2 cores have no room for; run it with `pytest -m slow tests/ops/test_demo.py`
(or `bash scripts/demo`) after a change to the demo or to what it calls."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config import KwalConfig, ObjectStoreConfig
from infra.objectstore import S3Store

pytestmark = [pytest.mark.slow]


def test_the_demo_runs_end_to_end_and_every_cn_agrees_with_the_tn(
    kwal_config: KwalConfig, s3_config: ObjectStoreConfig, s3_store: S3Store, tmp_path: Path
) -> None:
    s3_store.ensure_bucket()
    kwal_config.objectstore = s3_config
    env = {**os.environ, **kwal_config.to_env(), "KWAL_CONFIG": os.devnull,
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    demo = subprocess.run(
        [sys.executable, "-m", "ops.cli", "demo", "--services", "2", "--transactions", "10"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=480,
    )
    out = demo.stdout
    assert demo.returncode == 0, f"{out[-3000:]}\n{demo.stderr[-3000:]}"
    lines = out.splitlines()

    def reported(key: str) -> str:  # the report's line `  <key padded> <value>`: its value
        found = [line[2 + len(key):].strip() for line in lines if line.startswith(f"  {key} ")]
        assert found, f"no {key!r} in the report:\n{out[-3000:]}"
        return found[-1]

    for table in ("shop.orders", "shop.stock"):
        for cn in ("rows (TN=CN)", "rows (TN=late CN)", "spark"):
            assert reported(f"{table} {cn}").endswith(" agree"), out[-3000:]
    assert reported("agree") == "True"
    assert int(reported("checkpoints_taken")) >= 1
    assert int(reported("committed")) > 0
