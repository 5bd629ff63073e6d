"""Pausing Python's cyclic garbage collector around bulk work that makes many objects.

Why: the collector runs each time the number of tracked objects grew by a quarter since
its last full pass, and a full pass walks the whole heap. Code that builds millions of
long-lived objects (replaying the WAL, rebuilding a TN at recovery) or decodes many
short-lived ones that make no cycles (a Spark source's chunk of Kafka messages) pays for
those walks again and again: measured ~12 us per WAL entry at opening, twice the cost of
the Spark source's loop (docs/perf-replay.md).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused(freeze_after: bool = False) -> Iterator[None]:
    """Disable the collector inside the block and restore its state after. With
    `freeze_after`, what exists at the end is moved to the permanent generation (never
    walked again): for a structure built once and kept for the process's life."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze_after:
            gc.freeze()
        if enabled:
            gc.enable()
