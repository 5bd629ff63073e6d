"""Queue idioms shared by kwal's threads."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")


def drain(q: queue.Queue[T] | queue.SimpleQueue[T]) -> Iterator[T]:
    """Yield what `q` holds without blocking, until it is empty. Taken one at a time,
    so an item put while the caller handles an earlier one is yielded too."""
    while True:
        try:
            item = q.get_nowait()
        except queue.Empty:
            return
        yield item
