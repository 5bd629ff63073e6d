"""Hybrid logical clock: int64 timestamps ``physical_ms << 16 | logical``, strictly increasing."""

from __future__ import annotations

import threading
import time

LOGICAL_BITS = 16


class HybridClock:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0

    def now(self) -> int:
        """A fresh timestamp, greater than every one returned or observed before."""
        physical = (time.time_ns() // 1_000_000) << LOGICAL_BITS
        with self._lock:
            ts = physical if physical > self._last else self._last + 1
            self._last = ts
            return ts

    def observe(self, ts: int) -> None:
        """Make every later `now()` greater than `ts` (replay, reads at a given ts)."""
        with self._lock:
            if ts > self._last:
                self._last = ts

    def last(self) -> int:
        with self._lock:
            return self._last
