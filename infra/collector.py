"""Pausing Python's cyclic garbage collector around bulk work that makes many objects.

Why: the collector runs each time the number of tracked objects grew by a quarter since
its last full pass, and a full pass walks the whole heap. Code that builds millions of
long-lived objects (replaying the WAL, rebuilding a TN at recovery) or decodes many
short-lived ones that make no cycles (a Spark source's chunk of Kafka messages) pays for
those walks again and again: measured ~12 us per WAL entry at opening, twice the cost of
the Spark source's loop (docs/perf-replay.md).

A long-running process (the TN, a CN) also freezes what it allocated while starting
(`freeze_startup_heap`): each full collection then walks only what came after, and the
pause of one stops growing with the imports (docs/perf-commit.md, "commit->visible").
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


def freeze_startup_heap() -> None:
    """Called once a long-running process has started (the TN once it recovered, a CN
    before it follows its topics): what it allocated so far (modules, pyarrow, the
    recovered catalog) moves out of the cyclic collector's reach, so a full collection
    scans only what came after and its pause stops growing with the imports. Measured in
    `kwal bench logtail`: the TN process's gen-2 pauses went from 50-70 ms to 13-39 ms; a
    CN that did not freeze paid a 120-230 ms gen-2 pause (on a loaded machine) on its
    first records, and each one delays every commit behind it. Objects freed by reference
    count are freed as before; only cycles among the frozen objects are never collected."""
    gc.collect()
    gc.freeze()


# Young-generation threshold of a process that commits at a high rate (the TN): the
# collector's first generation runs every 700 net container allocations by default,
# i.e. several times per commit group of the TN (each request's decoded objects, the
# group's engine transaction, its results), and each run walks whatever of those is
# still alive at that instant. At 10,000 most of them are freed by reference count before
# a collection sees them. Bounded: at most this many container objects wait for a pass.
HOT_GEN0_THRESHOLD = 10_000


def raise_young_threshold(gen0: int = HOT_GEN0_THRESHOLD) -> None:
    """Make the collector's first generation run every `gen0` net allocations (the older
    generations' ratios unchanged). Measured in docs/perf-commit.md, "2026-11-27 (6)"."""
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0, gen1, gen2)

