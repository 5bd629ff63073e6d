"""The TN's `kwal_log_failures` counter moves when its log fails (issue 30, item 2).

`tn.service.main.run` (the TN's whole loop: recover, serve, halt on a log failure)
runs in this process on the session's Kafka broker, over the in-memory log driver with
a fault switch: once a client's transaction committed, the next append (another
transaction's) fails with a
plain driver error (kind `failed`) or a fencing error (kind `fenced`). The TN counts it
and stops by itself (the in-memory log cannot be reopened: status 1, before it would
reopen a failed log or exit as fenced), and the counter of that kind, and only that one,
has moved by one.
"""

from __future__ import annotations

import gc
import signal
import threading
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from infra.config import KwalConfig
from infra.metrics import METRICS
from infra.topics import ensure_topics
from producers import Client
from tests.waiting import wait_until
from tn.logstore.driver import LogFencedError, LogStoreError
from tn.logstore.memory_backend import MemoryDriver
from tn.service import main as tn_main

KINDS = ("failed", "fenced")


class FaultyDriver(MemoryDriver):
    """The in-memory driver whose appends fail once `fail_with` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.appends = 0
        self.fail_with: Exception | None = None

    def append(self, lsn: int, payload: bytes) -> Future[int]:
        self.appends += 1
        if self.fail_with is not None:
            future: Future[int] = Future()
            future.set_exception(self.fail_with)
            return future
        return super().append(lsn, payload)


def count(kind: str) -> float:
    return METRICS.registry.get_sample_value("kwal_log_failures_total", {"kind": kind}) or 0.0


@pytest.mark.parametrize(
    ("kind", "error", "status"),
    [
        ("failed", LogStoreError("the broker went away"), 1),
        ("fenced", LogFencedError("a newer writer owns the log"), 1),
    ],
)
def test_the_log_failures_counter_moves_when_the_log_fails(
    kwal_config: KwalConfig,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    error: Exception,
    status: int,
) -> None:
    cfg = kwal_config
    cfg.wal.backend = "memory"
    ensure_topics(cfg)
    drivers: list[FaultyDriver] = []

    def open_driver(_cfg: KwalConfig) -> FaultyDriver:
        drivers.append(FaultyDriver())
        return drivers[-1]

    monkeypatch.setattr(tn_main, "open_driver", open_driver)
    before = {k: count(k) for k in KINDS}
    done = threading.Event()

    def inject() -> None:
        try:
            with Client(cfg, "log-failure") as client:
                client.begin().create_database("ok").commit(timeout=60)  # the TN is serving
                wait_until("the TN's driver", lambda: bool(drivers))
                drivers[0].fail_with = error
                # its outcome is unknown (no result comes): sent, not awaited
                client.begin().create_database("lost").commit_async()
                client.flush(30)
        finally:
            # never leave the test hanging: a TN that did not stop by itself is stopped
            if not done.wait(60):
                signal.raise_signal(signal.SIGTERM)

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    helper = threading.Thread(target=inject, daemon=True)
    helper.start()
    try:
        rc = tn_main.run(SimpleNamespace(), cfg)  # in the main thread: it sets signal handlers
    finally:
        done.set()
        gc.unfreeze()  # run() froze this process's heap at its start, as a TN's
        for s, h in handlers.items():
            signal.signal(s, h)
        helper.join(70)
    assert rc == status
    assert len(drivers) == 1  # it stopped instead of reopening
    after = {k: count(k) for k in KINDS}
    assert after[kind] == before[kind] + 1
    assert all(after[k] == before[k] for k in KINDS if k != kind)
