"""An in-process log driver: entries live in a list and are durable at once.

For unit tests of logic above the log (catalog, commit pipeline) and for a TN
that needs no persistence. It honours the whole driver contract except that
nothing survives the process.
"""

from __future__ import annotations

import bisect
import threading
from concurrent.futures import Future

from tn.logstore.ack_future import AckFuture
from tn.logstore.driver import LogClosedError, LogDriver, LogRecord


class MemoryDriver(LogDriver):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[LogRecord] = []
        self._truncated = 0
        self._closed = False

    def append(self, lsn: int, payload: bytes) -> Future[int]:
        future: Future[int] = AckFuture()
        with self._lock:
            if self._closed:
                future.set_exception(LogClosedError("memory log is closed"))
                return future
            expected = (self._records[-1].lsn if self._records else self._truncated) + 1
            if lsn != expected:
                raise ValueError(f"append of LSN {lsn}, expected {expected}")
            self._records.append(LogRecord(lsn, payload))
        future.set_result(lsn)
        return future

    def read(self, from_lsn: int, max_bytes: int) -> tuple[list[LogRecord], int]:
        with self._lock:
            start = max(from_lsn, self._truncated + 1)
            i = bisect.bisect_left([r.lsn for r in self._records], start)
            out: list[LogRecord] = []
            size = 0
            for record in self._records[i:]:
                if out and size + len(record.payload) > max_bytes:
                    break
                out.append(record)
                size += len(record.payload)
            next_lsn = out[-1].lsn + 1 if out else start
            return out, next_lsn

    def truncate(self, lsn: int) -> None:
        with self._lock:
            self._truncated = max(self._truncated, lsn)
            self._records = [r for r in self._records if r.lsn > self._truncated]

    def truncated(self) -> int:
        return self._truncated

    def last_lsn(self) -> int:
        with self._lock:
            return self._records[-1].lsn if self._records else self._truncated

    def close(self) -> None:
        with self._lock:
            self._closed = True
