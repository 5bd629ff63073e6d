"""What every benchmark shares: percentiles and the one JSON line it prints."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO


def percentile(samples: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) by nearest rank; 0.0 for no samples."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return float(ordered[rank])


def machine_loop_ms() -> float:
    """How fast this machine runs Python now: the best of 3 runs of a fixed loop of integer
    arithmetic, in ms. Printed beside a bench's figures (``machine_loop_ms_start``,
    ``machine_loop_ms_end``) because a shared machine's speed swings within minutes: on the
    2-core machine of docs/perf-commit.md (10), raw Kafka in consecutive runs went from
    190k to 430k records/s and every process's CPU per commit moved with it. Two runs
    compare when their loop times do."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        x = 0
        for i in range(500_000):
            x += i * i
        best = min(best, time.perf_counter() - start)
    return round(best * 1000, 1)


def emit(result: dict[str, Any], out: TextIO | None = None) -> None:
    """Print the benchmark's figures as one JSON line (the only stdout line a bench writes),
    with the machine's speed at its end (`machine_loop_ms`)."""
    result.setdefault("machine_loop_ms_end", machine_loop_ms())
    stream = out or sys.stdout
    stream.write(json.dumps(result, sort_keys=True) + "\n")
    stream.flush()


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("inf")

