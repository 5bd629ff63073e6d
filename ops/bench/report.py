"""What every benchmark shares: percentiles and the one JSON line it prints."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO


def percentile(samples: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) by nearest rank; 0.0 for no samples."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return float(ordered[rank])


def emit(result: dict[str, Any], out: TextIO | None = None) -> None:
    """Print the benchmark's figures as one JSON line (the only stdout line a bench writes)."""
    stream = out or sys.stdout
    stream.write(json.dumps(result, sort_keys=True) + "\n")
    stream.flush()


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("inf")

