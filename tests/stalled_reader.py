"""A Kafka reader that stops fetching, for the tests of `infra.reader_stall`: its real
consumer's partitions paused under it, as librdkafka's fetcher stops after a broker
restart.

The pause is made on the reader's own thread, in its next poll (the module's
`poll_batch`, replaced): librdkafka's pause waits for the consumer's queue, and made from
another thread while the reader polls it hung a test once (CI, 600 s)."""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

import pytest

from infra.metrics import METRICS
from tests.waiting import wait_until


class StalledReader:
    """`stall()` pauses every partition of the reader that polls through `module`'s
    `poll_batch`; `reassigned()` is `kwal_reader_reassigned_total{reader=<reader>}`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: ModuleType, reader: str) -> None:
        self.reader = reader
        self._pause = threading.Event()
        real_poll = module.poll_batch

        def poll_pausing_once(consumer: Any, n: int, timeout: float) -> list[Any]:
            if self._pause.is_set():
                consumer.pause(consumer.assignment())
                self._pause.clear()
            return real_poll(consumer, n, timeout)

        monkeypatch.setattr(module, "poll_batch", poll_pausing_once)

    def stall(self) -> None:
        self._pause.set()
        wait_until(f"the {self.reader} reader paused its partitions", lambda: not self._pause.is_set(), 30)

    def reassigned(self) -> float:
        return METRICS.registry.get_sample_value(
            "kwal_reader_reassigned_total", {"reader": self.reader}
        ) or 0.0
