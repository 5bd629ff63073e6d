"""The logical-LSN window and in-order acknowledgement (seed 004).

Entries are issued to Kafka concurrently and may become durable out of LSN
order (several records in flight, several partitions). `Window` turns
"record [first, last] is durable" events into acknowledgements that only
ever advance the *contiguous* acknowledged LSN:

1. `admit(lsn)` registers an entry's future; the caller must first wait for
   `room_for(lsn)`: the newest issued LSN may be at most `size` ahead of the
   oldest unacknowledged one (`lsn <= acked + size`);
2. `durable(first, last)` records a durable range, advances `acked` while the
   next LSN is covered, and returns the futures now acknowledged, in LSN order;
3. `fail_all()` hands back every unacknowledged (LSN, future) (the caller fails them).

Not thread-safe: the writer calls it under its lock.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future


class Window:
    def __init__(self, size: int, acked: int) -> None:
        if size < 1:
            raise ValueError(f"window must be >= 1, got {size}")
        self.size = size
        self.acked = acked  # contiguous acknowledged LSN
        self._pending: deque[tuple[int, Future[int], float]] = deque()
        self._durable: dict[int, int] = {}  # first -> last, not yet contiguous

    def room_for(self, lsn: int) -> bool:
        """True when issuing `lsn` keeps it within `size` of the oldest unacknowledged LSN."""
        return lsn <= self.acked + self.size

    def admit(self, lsn: int, future: Future[int], now: float) -> None:
        self._pending.append((lsn, future, now))

    def durable(self, first: int, last: int) -> list[tuple[int, Future[int]]]:
        """Step 2: note [first, last] durable; return newly acknowledged futures in LSN order."""
        if last < first or last <= self.acked:
            return []
        self._durable[max(first, self.acked + 1)] = last
        while self.acked + 1 in self._durable:
            self.acked = self._durable.pop(self.acked + 1)
        done: list[tuple[int, Future[int]]] = []
        while self._pending and self._pending[0][0] <= self.acked:
            lsn, fut, _ = self._pending.popleft()
            done.append((lsn, fut))
        return done

    def oldest_pending_since(self) -> float | None:
        """When the oldest unacknowledged entry was appended (None when all are acknowledged)."""
        return self._pending[0][2] if self._pending else None

    def pending(self) -> int:
        return len(self._pending)

    def fail_all(self) -> list[tuple[int, Future[int]]]:
        """Step 3: every unacknowledged (LSN, future), oldest first; the window is then empty."""
        out = [(lsn, fut) for lsn, fut, _ in self._pending]
        self._pending.clear()
        self._durable.clear()
        return out
