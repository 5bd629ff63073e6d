"""The Spark CN started from a checkpoint (pull): a TN with checkpoints (one after a
compaction) and logtail truncation, then a fresh job that starts from the newest manifest
and agrees with the TN at every ts from the horizon to its watermark. On the real broker,
a real SparkSession and the S3 API (moto server)."""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import pytest

from consumers.core.exceptions import BelowHorizonError, BootstrapError, TruncatedLogtailError
from consumers.spark.bootstrap import BOOTSTRAP_BATCH
from consumers.spark.job import run, start_query
from consumers.spark.progress import load_progress
from consumers.spark.reader import read_as_of, read_state, state_ts, watermark
from infra.config import KwalConfig
from infra.objectstore import FolderStore, ObjectStore
from tests.logtail.conftest import COLUMNS, Tn, checkpoint_then_compact, random_steps, start_tn
from tests.spark.helpers import spark_rows, tn_rows
from tn.memtable.block import BLOCK_ROWS
from tn.txn.transaction import Transaction

pytestmark = pytest.mark.spark

TABLES = ["db.a", "db.b"]
TIMEOUT_S = 180


def _run(spark: Any, cfg: KwalConfig, output: Path, store: ObjectStore | None, mode: str) -> None:
    topics = {t: cfg.topics.logtail(*t.split(".", 1)) for t in TABLES}
    q = start_query(
        spark, cfg.bootstrap, cfg.topics.catalog, topics, output, trigger="available-now",
        store=store, from_checkpoint=mode,
    )
    try:
        assert q.awaitTermination(TIMEOUT_S), "the query did not finish"
        assert q.exception() is None, q.exception()
    finally:
        q.stop()


@pytest.fixture
def tn_s3(kwal_config: KwalConfig, s3_store: ObjectStore) -> Any:
    tn = start_tn(kwal_config, s3_store)
    yield tn
    tn.close()


def test_a_job_started_after_checkpoints_starts_from_the_newest_and_agrees_with_the_tn(
    spark: Any, tn_s3: Tn, kwal_config: KwalConfig, tmp_path: Path
) -> None:
    """Three checkpoints, one after a compaction; a fresh job (`always`, so that it runs
    on every broker) starts from the third: its horizon and start offsets are the
    manifest's, reads below the horizon are refused, and at sampled ts from the horizon to
    the watermark, and in its current state, it equals the TN. Run again after more work,
    it resumes from Spark's checkpoint and keeps its horizon."""
    tn, cfg = tn_s3, kwal_config
    rng = random.Random(7)
    stamps: list[int] = []
    checkpoint_then_compact(tn, rng, 30, stamps)
    random_steps(tn, rng, 30, stamps)
    # acknowledged before the second checkpoint, which must list every topic's offset
    assert tn.logtail.publisher.flush(30), tn.logtail.publisher.errors
    second = tn.checkpoint()
    # Between the last two checkpoints: b dropped and created again, more changes. The
    # third checkpoint is taken as if the logtail publisher had acknowledged nothing since
    # the second (its offsets are lower bounds, and then the second's): every record of
    # this stretch, all at or below its ts, is met again on the topics after the start
    # positions -- applied twice, the drop + create would revive b's first incarnation.
    def recreate_b(t: Transaction) -> None:
        t.drop_table("db", "b")
        t.create_table("db", "b", COLUMNS, "id")

    stamps.append(tn.commit(recreate_b))
    random_steps(tn, rng, 20, stamps)
    assert tn.logtail.publisher.flush(30), tn.logtail.publisher.errors
    tn.runner.logtail_offsets = lambda: {}
    third = tn.checkpoint()
    assert third.logtail_offsets == second.logtail_offsets
    random_steps(tn, rng, 25, stamps)  # after the last checkpoint: only in the logtail
    final = tn.engine.heartbeat().result(10)
    assert tn.logtail.publisher.flush(30), tn.logtail.publisher.errors

    output = tmp_path / "out"
    _run(spark, cfg, output, tn.store, "always")
    prog = load_progress(output)
    assert prog is not None and prog.batch_id > BOOTSTRAP_BATCH
    assert prog.horizon == third.ts
    assert prog.start_offsets == {t: third.logtail_offsets.get(t, -2) for t in prog.start_offsets}
    assert min(prog.start_offsets.values()) > 0  # every topic starts past its beginning
    assert watermark(output) >= final
    checked = below = 0
    later = [ts for ts in stamps if ts >= third.ts]
    for ts in [*stamps[:: max(1, len(stamps) // 10)], *later[:: max(1, len(later) // 5)], final]:
        for name in ("a", "b"):
            if ts < third.ts:
                with pytest.raises(BelowHorizonError, match=f"checkpoint at ts {third.ts}"):
                    read_as_of(spark, output, f"db.{name}", ts)
                below += 1
                continue
            expected = tn_rows(tn, name, ts)
            assert spark_rows(read_as_of(spark, output, f"db.{name}", ts)) == expected, (name, ts)
            checked += 1
    assert checked >= 10 and below >= 10
    for name in ("a", "b"):
        got = spark_rows(read_state(spark, output, f"db.{name}"))
        assert got == tn_rows(tn, name, state_ts(output, f"db.{name}"))
    assert len(spark_rows(read_state(spark, output, "db.a"))) > BLOCK_ROWS  # from the objects

    # more work, the same job again: it resumes from Spark's checkpoint, no new bootstrap
    random_steps(tn, rng, 15, stamps)
    tn.checkpoint()
    final2 = tn.engine.heartbeat().result(10)
    assert tn.logtail.publisher.flush(30), tn.logtail.publisher.errors
    _run(spark, cfg, output, tn.store, "always")
    prog2 = load_progress(output)
    assert prog2 is not None and prog2.horizon == third.ts and prog2.batch_id > prog.batch_id
    for name in ("a", "b"):
        expected = tn_rows(tn, name, final2)
        assert spark_rows(read_as_of(spark, output, f"db.{name}", final2)) == expected, name


def test_auto_starts_from_the_checkpoint_only_when_a_topic_was_truncated(
    spark: Any,
    kwal_config: KwalConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`auto` reads the topics from their first records while they have them (full
    history), and starts from the checkpoint once one was truncated -- reported by the
    driver's consumer here, so that it runs on every broker (the decision, not Kafka, is
    under test; the test above covers the bootstrap itself). Without a checkpoint in the
    store, `kwal cn spark` exits 1 naming the problem and leaves nothing behind."""
    from consumers.spark.kafka_io import EndFinder

    cfg = kwal_config
    tn = start_tn(cfg, FolderStore(tmp_path / "objects"))
    try:
        rng = random.Random(3)
        stamps: list[int] = []
        tn.create("a", "b")
        random_steps(tn, rng, 20, stamps)
        assert tn.logtail.publisher.flush(30), tn.logtail.publisher.errors
        ckpt = tn.checkpoint()
        random_steps(tn, rng, 10, stamps)
        final = tn.engine.heartbeat().result(10)
        assert tn.logtail.publisher.flush(30), tn.logtail.publisher.errors

        whole = tmp_path / "whole"
        _run(spark, cfg, whole, tn.store, "auto")
        prog = load_progress(whole)
        assert prog is not None and prog.horizon == 0 and prog.start_offsets == {}
        early = stamps[0]
        assert spark_rows(read_as_of(spark, whole, "db.a", early)) == tn_rows(tn, "a", early)

        topic = cfg.topics.logtail("db", "a")
        real = EndFinder.watermarks

        def reported(self: EndFinder, keys: Any) -> dict[tuple[str, int], tuple[int, int]]:
            return {k: (1 if k[0] == topic else lo, hi) for k, (lo, hi) in real(self, keys).items()}

        monkeypatch.setattr(EndFinder, "watermarks", reported)
        pulled = tmp_path / "pulled"
        _run(spark, cfg, pulled, tn.store, "auto")
        prog = load_progress(pulled)
        assert prog is not None and prog.horizon == ckpt.ts
        for name in ("a", "b"):
            expected = tn_rows(tn, name, final)
            assert spark_rows(read_as_of(spark, pulled, f"db.{name}", final)) == expected, name
        # a job started from a checkpoint has no rows of another table before it
        more = {t: cfg.topics.logtail(*t.split(".", 1)) for t in [*TABLES, "db.c"]}
        with pytest.raises(BootstrapError, match=r"db\.c: this job started from the checkpoint"):
            start_query(spark, cfg.bootstrap, cfg.topics.catalog, more, pulled)
        with pytest.raises(TruncatedLogtailError, match=rf"{topic}\[0\] starts at offset 1.*object store"):
            start_query(spark, cfg.bootstrap, cfg.topics.catalog, {"db.a": topic}, tmp_path / "x")
    finally:
        tn.close()

    # (the watermarks reported above still say db.a was truncated: auto needs the store)
    empty = tmp_path / "empty-store"
    cfg.objectstore.url = f"file://{empty}"
    args = argparse.Namespace(tables="db.a", output=str(tmp_path / "none"), trigger="available-now", timeout=60)
    assert run(args, cfg) == 1
    assert "holds no checkpoint" in capsys.readouterr().err
    assert load_progress(tmp_path / "none") is None
    with pytest.raises(BootstrapError, match="holds no checkpoint"):
        start_query(spark, cfg.bootstrap, cfg.topics.catalog, {"db.a": topic}, tmp_path / "y",
                    store=FolderStore(empty), from_checkpoint="always")
