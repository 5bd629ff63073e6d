"""Delivery reports as librdkafka gives them, for tests that must see a rare one."""

from __future__ import annotations

from typing import Any


class NoOffset:
    """A real delivery report with its offset hidden: what librdkafka gives after a
    DUPLICATE_SEQUENCE_NUMBER answer (success, no offset). The embedded broker gives that
    answer after a restart, also for records it did not keep."""

    def __init__(self, msg: Any) -> None:
        self._msg = msg

    def offset(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._msg, name)
