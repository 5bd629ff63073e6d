"""The one bounded wait tests use: poll a condition, fail naming what never held."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(what: str, cond: Callable[[], object], timeout_s: float = 60.0, poll_s: float = 0.05) -> None:
    """Poll `cond` until it is true; an AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f}s: {what}")
        time.sleep(poll_s)
