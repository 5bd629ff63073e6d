"""The TN's gauges, sampled every `tn.metrics_interval_s` from the parts that know them.

Counters (commits, aborts by reason, compactions, log failures) and the commit latency
histogram are updated where they happen; everything else is a reading taken here:

- WAL bytes and entries since the last checkpoint (`CheckpointRunner.wal_since`);
- the last checkpoint's ts and age (before the first one: the age since this TN started);
- the newest LSN and the durable truncation point;
- window occupancy and logtail lag: the most at once since the previous sample
  (`LogStore.window`, `LogtailPublisher.lag_peak`): a reading between two bursts would
  show 0 under load;
- retention headroom: retention.ms minus the age of the oldest WAL entry no checkpoint
  covers (its commit ts's wall-clock part), +Inf when retention is unlimited or the
  backend has none (file, memory). Below 0, retention may already have deleted it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from infra.metrics import METRICS, Metrics
from tn.checkpoint.runner import CheckpointRunner
from tn.logstore.driver import LogStore
from tn.txn.clock import LOGICAL_BITS

log = logging.getLogger("kwal.tn.metrics")


def ts_seconds(ts: int) -> float:
    """The wall-clock time (epoch seconds) of a hybrid-clock timestamp."""
    return (ts >> LOGICAL_BITS) / 1000.0


class MetricsSampler:
    def __init__(
        self,
        log_store: LogStore,
        runner: CheckpointRunner,
        publisher: Any,
        interval_s: float = 1.0,
        metrics: Metrics = METRICS,
    ) -> None:
        self.log = log_store
        self.runner = runner
        self.publisher = publisher
        self.interval_s = interval_s
        self.m = metrics
        self.started = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kwal-tn-metrics", daemon=True)

    def _retention_ms(self) -> int | None:
        driver = self.log.driver
        read = getattr(driver, "retention_ms", None)  # the Kafka backend's; others keep all
        return int(read()) if callable(read) else -1

    def sample(self) -> None:
        m = self.m
        entries, nbytes = self.runner.wal_since()
        m.wal_entries_since_checkpoint.set(entries)
        m.wal_bytes_since_checkpoint.set(nbytes)
        last = self.runner.last
        now = time.time()
        if last is not None:
            m.last_checkpoint_ts.set(last.ts)
            m.last_checkpoint_age.set(max(0.0, now - last.created_at))
        else:
            m.last_checkpoint_age.set(now - self.started)
        m.wal_last_lsn.set(self.log.next_lsn() - 1)
        m.wal_truncated_lsn.set(self.log.truncated())
        m.window_occupancy.set(self.log.window()[1])
        m.logtail_lag.set(self.publisher.lag_peak())
        retention = self._retention_ms()
        if retention is None:
            return  # the broker cannot say: keep the last value
        if retention < 0:
            m.retention_headroom.set(math.inf)
            return
        oldest = self.runner.oldest_uncovered_ts()
        age = now - ts_seconds(oldest) if oldest else 0.0
        m.retention_headroom.set(retention / 1000.0 - age)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - metrics never stop the TN
                log.exception("metrics sample failed")

    def start(self) -> MetricsSampler:
        self.sample()
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
