"""The TN's status record on the WAL meta topic, read by `kwal ops status`."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Producer

from infra.config import KwalConfig

STATUS_KEY = b"status"  # meta-topic key of the TN's periodic status record (ignored by MetaState)


def status_record(driver_status: Mapping[str, Any], now_ms: int | None = None) -> bytes:
    """The value a TN may publish under `STATUS_KEY` on the meta topic (periodically, e.g.
    with its heartbeat) so that `kwal ops status` can show the in-flight window:
    `KafkaDriver.status()` plus the window size and a timestamp."""
    doc = dict(driver_status)
    doc["ts_ms"] = int(time.time() * 1000) if now_ms is None else now_ms
    return json.dumps(doc, sort_keys=True, default=str).encode()


class StatusPublisher:
    """Publishes the TN's status record (`status_record(status_fn())`) on the meta topic every
    `interval_s`, on a daemon thread with a producer of its own (not idempotent: it must not
    slow the WAL's idempotent producer). For the TN:

        pub = StatusPublisher(cfg, lambda: {**driver.status(), "window": cfg.wal.window}).start()
        ...
        pub.stop()

    Failures are counted, never raised: status is for operators only. Keep the interval in
    seconds: a writer reads the whole meta topic when it opens.
    """

    def __init__(
        self, cfg: KwalConfig, status_fn: Callable[[], Mapping[str, Any]], interval_s: float = 5.0
    ) -> None:
        self._cfg = cfg
        self._status_fn = status_fn
        self._interval_s = interval_s
        self._producer = Producer(cfg.kafka_client(**{"acks": "all", "linger.ms": 0}))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kwal-tn-status", daemon=True)
        self.failures = 0

    def start(self) -> StatusPublisher:
        self._thread.start()
        return self

    def publish(self) -> None:
        try:
            self._producer.produce(
                self._cfg.topics.wal_meta,
                status_record(self._status_fn()),
                key=STATUS_KEY,
                partition=0,
            )
            self._producer.poll(0)
        except Exception:  # noqa: BLE001 - status is best effort
            self.failures += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.publish()
            self._stop.wait(self._interval_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._producer.flush(timeout_s)
