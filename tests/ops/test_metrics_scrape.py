"""Metrics an on-call engineer can trust (issue 30, item 2): `/metrics` scraped over HTTP
from a real TN process (Kafka WAL) and from a Python CN while transactions commit and
abort, and every metric they export moves as it should. (The compaction counters move
in tests/checkpoint/test_compaction_scheduled.py, which scrapes its TN too.)"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pytest

from consumers.core.cn import CN
from infra.config import KwalConfig
from infra.metrics import Metrics
from infra.objectstore import open_store
from infra.processes import free_port
from infra.topic_scan import admin_for
from infra.topics import ensure_topics
from ops.retention import apply_retention
from producers import Client, CommitResult, ValidationError
from tests.ops.scrape import Samples, scrape, value
from tn.service.process import TnProcess

RETENTION_MS = 3_600_000
# exported, and checked in tests/checkpoint/test_compaction_scheduled.py instead
ELSEWHERE = {"kwal_compactions", "kwal_compacted_blocks"}
# exported; moves only when the WAL fails (a fenced or failed log): checked in
# tests/service/test_log_failures.py
NOT_HERE = {"kwal_log_failures"}
# moves only in secure mode, for a record without a principal (tests/security/test_secure_kafka.py)
NOT_HERE |= {"kwal_security_dropped"}
# moves only when a Kafka reader stalls (tests/infra/test_reader_stall.py, and for each reader
# tests/service/test_service.py and tests/logtail/test_push.py)
NOT_HERE |= {"kwal_reader_reassigned"}
# move only when a Kafka client reaches no broker for several checks in a row
# (tests/infra/test_reader_stall.py, tests/producers/test_lost_producer.py)
NOT_HERE |= {"kwal_reader_replaced", "kwal_producer_replaced"}


class Watch:
    """Scrapes until every condition held at least once (each over the scrapes so far)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.history: list[Samples] = []

    def series(self, name: str, **labels: str) -> list[float]:
        return [value(s, name, **labels) for s in self.history]

    def up_and_down(self, name: str) -> bool:
        """Rose between two scrapes and fell between two others."""
        xs = self.series(name)
        return rose(xs) and fell(xs)

    def until(self, conditions: dict[str, Callable[[], bool]], timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        pending = dict(conditions)
        while True:
            self.history.append(scrape(self.port))
            pending = {k: c for k, c in pending.items() if not c()}
            if not pending:
                return
            assert time.monotonic() < deadline, f"never held: {sorted(pending)}"
            time.sleep(0.1)


def rose(xs: list[float]) -> bool:
    return any(b > a for a, b in zip(xs, xs[1:], strict=False))


def fell(xs: list[float]) -> bool:
    return any(b < a for a, b in zip(xs, xs[1:], strict=False))


@pytest.fixture
def tn(kwal_config: KwalConfig, tmp_path: Path) -> TnProcess:
    cfg = kwal_config
    cfg.tn.metrics_port = free_port()
    cfg.tn.metrics_interval_s = 0.2
    cfg.tn.checkpoint_interval_s = 1.0
    cfg.tn.heartbeat_ms = 50
    ensure_topics(cfg)
    # a finite retention on the WAL topic, so that the headroom is a number
    apply_retention(admin_for(cfg, 10), [cfg.topics.wal], {"retention.ms": RETENTION_MS}, 10)
    return TnProcess(cfg, tmp_path)


def test_every_metric_moves_under_load(kwal_config: KwalConfig, tn: TnProcess) -> None:
    cfg = kwal_config
    tn.start()
    cn_port = free_port()
    # from the newest checkpoint when there is one: checkpoints every second truncate the
    # logtail topics behind them
    cn = CN(cfg, ["m.t"], open_store(cfg.objectstore), name="scrape", metrics_port=cn_port)
    try:
        watch = Watch(cfg.tn.metrics_port)
        watch.history.append(scrape(cfg.tn.metrics_port))
        with Client(cfg, "metrics") as client:
            t = client.begin()
            t.create_database("m")
            t.create_table("m.t", [("id", "int64"), ("v", "string")], "id")
            t.commit(timeout=60)
            cn.start()
            futures: list[Future[CommitResult]] = []
            for i in range(40):
                t = client.begin()
                t.insert("m.t", [{"id": i, "v": "x"}])
                futures.append(t.commit_async())
            last = max(f.result(timeout=60).commit_ts for f in futures)
            for i in range(3):
                t = client.begin()
                t.insert("m.t", [{"id": i, "v": "again"}])
                with pytest.raises(ValidationError):
                    t.commit(timeout=60)
            t = client.begin()
            t.insert("m.nope", [{"id": 1}])
            with pytest.raises(ValidationError):
                t.commit(timeout=60)
        first = watch.history[0]
        checked = {
            "kwal_commits": lambda: watch.series("kwal_commits_total")[-1]
            >= value(first, "kwal_commits_total") + 41,
            "kwal_aborts": lambda: (
                watch.series("kwal_aborts_total", reason="duplicate_key")[-1] == 3
                and watch.series("kwal_aborts_total", reason="unknown_table")[-1] == 1
            ),
            "kwal_commit_latency_seconds": lambda: (
                watch.series("kwal_commit_latency_seconds_count")[-1] >= 45
                and watch.series("kwal_commit_latency_seconds_sum")[-1] > 0
                and watch.series("kwal_commit_latency_seconds_bucket", le="+Inf")[-1] >= 45
            ),
            # rise with commits, fall back when a checkpoint covers them
            "kwal_wal_bytes_since_checkpoint": lambda: watch.up_and_down(
                "kwal_wal_bytes_since_checkpoint"
            ),
            "kwal_wal_entries_since_checkpoint": lambda: watch.up_and_down(
                "kwal_wal_entries_since_checkpoint"
            ),
            "kwal_wal_window_occupancy": lambda: max(watch.series("kwal_wal_window_occupancy")) >= 1,
            "kwal_logtail_lag_entries": lambda: max(watch.series("kwal_logtail_lag_entries")) >= 1,
            "kwal_wal_last_lsn": lambda: rose(watch.series("kwal_wal_last_lsn")),
            "kwal_wal_truncated_lsn": lambda: rose(watch.series("kwal_wal_truncated_lsn")),
            "kwal_last_checkpoint_ts": lambda: watch.series("kwal_last_checkpoint_ts")[-1] >= last,
            "kwal_last_checkpoint_age_seconds": lambda: watch.up_and_down(
                "kwal_last_checkpoint_age_seconds"
            ),
            # retention.ms minus the age of the oldest entry no checkpoint covers: below the
            # setting while entries wait, back up to it after a checkpoint
            "kwal_wal_retention_headroom_seconds": lambda: (
                all(
                    math.isfinite(v) and 0 < v <= RETENTION_MS / 1000
                    for v in watch.series("kwal_wal_retention_headroom_seconds")
                )
                and watch.up_and_down("kwal_wal_retention_headroom_seconds")
            ),
        }
        watch.until(checked)
        exported = {f.name for f in Metrics().registry.collect()}
        tn_metrics = {n for n in exported if not n.startswith("kwal_cn_")}
        assert tn_metrics == set(checked) | ELSEWHERE | NOT_HERE  # none left unchecked

        # the CN's own endpoint: its watermark follows the TN, its lag is a real one
        assert cn.wait_for(last, "m.t", timeout_s=60), cn.errors
        cn_watch = Watch(cn_port)
        labels = {"cn": "scrape"}
        cn_checked = {
            "kwal_cn_watermark_ts": lambda: cn_watch.series("kwal_cn_watermark_ts", **labels)[-1] >= last
            and rose(cn_watch.series("kwal_cn_watermark_ts", **labels)),
            "kwal_cn_applied_records": lambda: cn_watch.series(
                "kwal_cn_applied_records_total", **labels)[-1] >= 41,
            # the heartbeats keep it within a day of now (an idle CN that never applied a
            # heartbeat would show about 56 years)
            "kwal_cn_watermark_lag_seconds": lambda: 0 <= cn_watch.series(
                "kwal_cn_watermark_lag_seconds", **labels)[-1] < 86_400,
        }
        cn_watch.until(cn_checked)
        assert set(cn_checked) == {n for n in exported if n.startswith("kwal_cn_")}
    finally:
        cn.close()
        tn.kill()
