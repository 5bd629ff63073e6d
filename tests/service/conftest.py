"""Fixtures: a TN service running in-process (threads) on a real broker.

The engine is the real `tn.engine.Engine` on a memory log when it imports;
`KWAL_TEST_FAKE_ENGINE=1` (or an engine that does not import yet) uses the
stand-in in `fake_engine.py`.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from infra.config import KwalConfig
from infra.topics import ensure_topics
from producers import Client
from tn.logstore.driver import LogStore
from tn.logstore.memory_backend import MemoryDriver
from tn.service import TnService


class SlowDriver(MemoryDriver):
    """A memory log whose appends become durable `delay_s` later, in order
    (like a group-committed fsync), so that transactions overlap in the pipeline."""

    def __init__(self, delay_s: float = 0.005) -> None:
        super().__init__()
        self.delay_s = delay_s
        self._queue: queue.SimpleQueue[tuple[float, Future[int], Future[int]] | None] = (
            queue.SimpleQueue()
        )
        self._worker = threading.Thread(target=self._run, daemon=True)
        self._worker.start()

    def append(self, lsn: int, payload: bytes) -> Future[int]:
        inner = super().append(lsn, payload)
        outer: Future[int] = Future()
        self._queue.put((time.monotonic() + self.delay_s, inner, outer))
        return outer

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            due, inner, outer = item
            time.sleep(max(0.0, due - time.monotonic()))
            exc = inner.exception()
            if exc is not None:
                outer.set_exception(exc)
            else:
                outer.set_result(inner.result())

    def close(self) -> None:
        super().close()
        self._queue.put(None)


def make_engine() -> Any:
    if os.environ.get("KWAL_TEST_FAKE_ENGINE") != "1":
        try:
            from tn.engine import Engine

            return Engine(LogStore(SlowDriver()))
        except ImportError:
            pass
    from tests.service.fake_engine import FakeEngine

    return FakeEngine()


class RunningTn:
    def __init__(self, cfg: KwalConfig, engine: Any) -> None:
        self.cfg = cfg
        self.engine = engine
        self.service = TnService(cfg, engine)
        self.service.start()

    def restart(self) -> None:
        """A new service on the same engine (as after a clean stop)."""
        self.service.stop()
        self.service = TnService(self.cfg, self.engine)
        self.service.start()


@pytest.fixture
def tn(kwal_config: KwalConfig) -> Iterator[RunningTn]:
    ensure_topics(kwal_config)
    engine = make_engine()
    running = RunningTn(kwal_config, engine)
    try:
        yield running
    finally:
        running.service.stop(drain_timeout_s=5)
        engine.close()


@pytest.fixture
def client_factory(kwal_config: KwalConfig) -> Iterator[Callable[..., Client]]:
    made: list[Client] = []

    def make(**kw: Any) -> Client:
        c = Client(kwal_config, **kw)
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.close()


@pytest.fixture
def client(tn: RunningTn, client_factory: Callable[..., Client]) -> Client:
    return client_factory()
