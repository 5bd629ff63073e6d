"""The Spark CN's watermark lag in `kwal ops status` (issue 30, item 2).

A Spark CN (a real SparkSession) follows a TN's topics with its status listener attached
(`consumers.spark.status`); after its micro-batches, its report on the ops topic carries
the watermark the job committed, and `kwal ops status` (text and `--json`) shows it with
its lag."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from consumers.spark.job import start_query
from consumers.spark.reader import watermark
from consumers.spark.status import attach_status
from infra.cn_status import read_statuses
from infra.config import KwalConfig
from infra.objectstore import FolderStore
from ops import status as ops_status
from tests.logtail.conftest import Tn, start_tn
from tests.waiting import wait_until

pytestmark = [pytest.mark.spark]

TIMEOUT_S = 180


@pytest.fixture
def tn(kwal_config: KwalConfig, tmp_path: Path) -> Any:
    tn = start_tn(kwal_config, FolderStore(tmp_path / "objects"))
    yield tn
    tn.close()


def test_the_spark_cn_reports_its_watermark_lag_to_ops_status(
    spark: Any, tn: Tn, kwal_config: KwalConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = kwal_config
    tn.create("s")
    tn.commit(lambda t: t.insert("db", "s", [{"id": i, "v": str(i)} for i in range(50)]))
    final = tn.engine.heartbeat().result(10)
    assert tn.logtail.publisher.flush(30), tn.logtail.publisher.errors

    output = tmp_path / "cn-status-out"
    listener = attach_status(spark, cfg, output, "status-test")
    try:
        q = start_query(
            spark, cfg.bootstrap, cfg.topics.catalog, {"db.s": cfg.topics.logtail("db", "s")},
            output, trigger="available-now", from_checkpoint="never",
        )
        try:
            assert q.awaitTermination(TIMEOUT_S), "the query did not finish"
            assert q.exception() is None, q.exception()
        finally:
            q.stop()
        mark = watermark(output)
        assert mark >= final

        def reported() -> bool:
            return any(
                s["name"] == "status-test" and s["watermark"] == mark
                for s in read_statuses(cfg, 10)
            )

        wait_until("the CN's report of its committed watermark", reported, TIMEOUT_S, 0.2)
        assert listener.errors == []
    finally:
        spark.streams.removeListener(listener)

    args = SimpleNamespace(timeout=10.0, json=True, no_probe=True)
    ops_status.run(args, cfg)
    st = json.loads(capsys.readouterr().out)
    (mine,) = [s for s in st["cn_status"] if s["name"] == "status-test"]
    assert mine["cn"] == "spark" and mine["watermark"] == mark
    assert mine["tables"] == {"db.s": watermark(output, "db.s")}
    assert mine["lag_s"] is not None and mine["lag_s"] >= 0 and not mine["stale"]

    ops_status.run(SimpleNamespace(timeout=10.0, json=False, no_probe=True), cfg)
    text = capsys.readouterr().out
    assert re.search(rf"spark status-test  watermark {mark}  lag [0-9.]+s  batch \d+", text), text
