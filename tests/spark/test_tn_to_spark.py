"""The Spark CN following a real TN from its topics' first records (push only, no
checkpoint): seeded DML with updates and deletes, a drop + re-create, added columns, and a
table that only sees heartbeats. Its current state equals the TN's snapshot at the state's
ts, and its as-of reads equal the TN's at sampled ts up to its watermark. On the real
broker and a real SparkSession."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from consumers.core.exceptions import AboveWatermarkError
from consumers.spark.job import start_query
from consumers.spark.reader import read_as_of, read_state, state_ts, watermark
from infra.config import KwalConfig
from infra.objectstore import FolderStore
from tests.logtail.conftest import Tn, random_steps, start_tn
from tests.spark.helpers import spark_rows, tn_rows

pytestmark = [pytest.mark.spark, pytest.mark.tansu]  # tansu: the compatibility subset

TABLES = ["db.a", "db.b", "db.idle"]
TIMEOUT_S = 180


@pytest.fixture
def tn(kwal_config: KwalConfig, tmp_path: Path) -> Any:
    tn = start_tn(kwal_config, FolderStore(tmp_path / "objects"))
    yield tn
    tn.close()


def test_a_job_following_the_tn_from_the_first_records_equals_it_at_its_watermark(
    spark: Any, tn: Tn, kwal_config: KwalConfig, tmp_path: Path
) -> None:
    cfg = kwal_config
    rng = random.Random(11)
    stamps: list[int] = [tn.create("a", "b", "idle")]
    random_steps(tn, rng, 80, stamps)
    final = tn.engine.heartbeat().result(10)  # the idle table moves by heartbeats only
    assert tn.logtail.publisher.flush(30), tn.logtail.publisher.errors

    output = tmp_path / "out"
    topics = {t: cfg.topics.logtail(*t.split(".", 1)) for t in TABLES}
    q = start_query(
        spark, cfg.bootstrap, cfg.topics.catalog, topics, output, trigger="available-now",
        from_checkpoint="never", compact_interval_s=0.0,
    )
    try:
        assert q.awaitTermination(TIMEOUT_S), "the query did not finish"
        assert q.exception() is None, q.exception()
    finally:
        q.stop()

    mark = watermark(output)
    assert mark >= final
    assert watermark(output, "db.idle") >= final
    for name in ("a", "b", "idle"):
        at = state_ts(output, f"db.{name}")
        assert at >= final
        assert spark_rows(read_state(spark, output, f"db.{name}")) == tn_rows(tn, name, at), name
    assert tn_rows(tn, "a", final)  # the comparison is not between two empty tables
    checked = 0
    for ts in [*stamps[:: max(1, len(stamps) // 8)], mark]:
        for name in ("a", "b"):
            expected = tn_rows(tn, name, ts)
            assert spark_rows(read_as_of(spark, output, f"db.{name}", ts)) == expected, (name, ts)
            checked += 1
    assert checked >= 16
    with pytest.raises(AboveWatermarkError):  # a's own watermark: the job's is the minimum
        read_as_of(spark, output, "db.a", watermark(output, "db.a") + 1)
