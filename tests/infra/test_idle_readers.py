"""Readers of nearly idle topics let the broker hold an empty fetch IDLE_FETCH_WAIT_MS,
not the latency-bound readers' FETCH_WAIT_MS: each asked the broker again every 25-75 ms
before (docs/perf-commit.md, "2026-11-27 (8)")."""

from __future__ import annotations

from infra import control
from infra.config import KwalConfig
from infra.kafka_io import FETCH_WAIT_MS, IDLE_FETCH_WAIT_MS
from tn.logstore.kafka_backend.kio import reader_conf
from tn.logstore.kafka_backend.meta import watcher_conf


def test_idle_readers_wait_longer_than_latency_bound_ones() -> None:
    cfg = KwalConfig()
    assert IDLE_FETCH_WAIT_MS > FETCH_WAIT_MS
    # the ops topic (the TN's listener, a command's reply reader)
    assert control.reader_conf(cfg)["fetch.wait.max.ms"] == IDLE_FETCH_WAIT_MS
    # the WAL meta topic's fence watch, otherwise an internal reader like the others
    base = cfg.kafka_client()
    watch = watcher_conf(base)
    assert watch["fetch.wait.max.ms"] == IDLE_FETCH_WAIT_MS
    assert reader_conf(base)["fetch.wait.max.ms"] < IDLE_FETCH_WAIT_MS
    assert {k: v for k, v in watch.items() if k not in ("fetch.wait.max.ms", "group.id")} == {
        k: v for k, v in reader_conf(base).items() if k not in ("fetch.wait.max.ms", "group.id")
    }
