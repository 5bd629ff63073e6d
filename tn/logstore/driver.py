"""The log driver interface (seeds 003/004) and the LogStore that assigns logical LSNs.

A *driver* persists opaque entry payloads, each tagged with the logical LSN the
LogStore gave it. Backends (file, Kafka, memory) implement `LogDriver`; they
never decode payloads, with one exception: the Kafka backend writes a group of WAL
entries (`schemas.codec.EncodedEntry` payloads, which carry their entry) as one
columnar record (`schemas.wal_record`, format version 2) and hands back, for each,
a payload that `schemas.codec.decode_entry` turns into that entry.

Contract every backend keeps:

1. LSNs are logical, contiguous and start at 1. `append(lsn, payload)` is
   called with strictly increasing, gap-free LSNs (the LogStore guarantees it).
2. `append` returns at once; its future completes with the LSN once that entry
   *and every entry before it* is durable. Futures therefore complete in LSN
   order, even when the backend finishes writes out of order.
3. A future that fails means "not acknowledged": the entry may or may not be
   replayed later, but it was never reported durable.
4. `truncate(lsn)` declares every entry with LSN <= lsn disposable. The point is
   recorded durably; physical deletion may lag or never happen (a broker
   without DeleteRecords). `read` never returns an entry at or below it.
5. Opening a driver recovers it: `last_lsn()` is the highest LSN of the
   contiguous durable run after the truncation point (0 for an empty log),
   and the LogStore continues at `last_lsn() + 1`.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One entry as a driver stores it: its logical LSN and opaque payload."""

    lsn: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class RecordRun:
    """Entries lo..hi, stored together in one record and handed over as that record
    (`LogStore.runs`): `group` is its `schemas.wal_record.LazyGroup`, which decodes them
    all at once, so a replaying caller applies them as a group, not one by one."""

    lo: int
    hi: int
    group: Any


class LogStoreError(Exception):
    """Base class of log store errors."""


class LogClosedError(LogStoreError):
    """The driver was closed; no further appends are accepted."""


class LogFencedError(LogStoreError):
    """A newer writer owns the log: this one must stop and must not reopen it (reopening
    would fence the newer writer in turn)."""


class LogDriver(ABC):
    """A log backend: asynchronous, ordered, truncatable storage of entries."""

    @abstractmethod
    def append(self, lsn: int, payload: bytes) -> Future[int]:
        """Queue one entry; the future completes with `lsn` once it and all before it are durable."""

    @abstractmethod
    def read(self, from_lsn: int, max_bytes: int) -> tuple[list[LogRecord], int]:
        """Return entries with LSN >= from_lsn (at least one if any exist, then up to
        max_bytes of payload) and the LSN to continue from."""

    @abstractmethod
    def truncate(self, lsn: int) -> None:
        """Declare entries with LSN <= lsn disposable; record the point durably."""

    @abstractmethod
    def truncated(self) -> int:
        """The durable truncation point (0 when never truncated)."""

    @abstractmethod
    def last_lsn(self) -> int:
        """The highest LSN appended or recovered (0 when empty)."""

    @abstractmethod
    def close(self) -> None:
        """Flush what is queued, complete or fail every future, release resources."""

    def runs(self, from_lsn: int, max_bytes: int = 4 << 20) -> Iterator[LogRecord | RecordRun]:
        """Every stored entry from `from_lsn`, as `read` gives them; a backend that stores
        entries in groups may hand a group over whole, as a `RecordRun`."""
        lsn = from_lsn
        while True:
            batch, lsn = self.read(lsn, max_bytes)
            if not batch:
                return
            yield from batch

    def identity(self) -> str:
        """Names this log (its folder, its topic), so that a checkpoint taken of it is never
        recovered onto another log. Empty: the backend cannot tell (memory)."""
        return ""


class LogStore:
    """Assigns contiguous logical LSNs on top of a driver.

    The lock makes "take the next LSN" and "hand it to the driver" one step, so
    the driver always sees LSNs in order, whichever thread appends.
    """

    def __init__(self, driver: LogDriver) -> None:
        self._driver = driver
        self._lock = threading.Lock()
        self._next = driver.last_lsn() + 1
        self._in_flight = 0  # entries appended whose future has not completed
        self._peak = 0  # the most in flight at once since `window()` was last asked

    @property
    def driver(self) -> LogDriver:
        return self._driver

    def next_lsn(self) -> int:
        with self._lock:
            return self._next

    def append(self, encode: bytes | Callable[[int], bytes]) -> Future[int]:
        """Append one entry. `encode` is the payload, or a callable that builds the
        payload from the LSN it is given (the WAL entry embeds its own LSN)."""
        with self._lock:
            lsn = self._next
            payload = encode(lsn) if callable(encode) else encode
            future = self._driver.append(lsn, payload)
            self._next = lsn + 1
            self._in_flight += 1
            self._peak = max(self._peak, self._in_flight)
        future.add_done_callback(self._landed)
        return future

    def _landed(self, _future: Future[int]) -> None:
        with self._lock:
            self._in_flight -= 1

    def window(self) -> tuple[int, int]:
        """(entries in flight now, the most in flight at once since the last call): the
        window occupancy a metrics sample reports, which a sample taken between two
        bursts would otherwise miss."""
        with self._lock:
            peak, self._peak = self._peak, self._in_flight
            return self._in_flight, peak

    def records(self, from_lsn: int | None = None, max_bytes: int = 4 << 20) -> Iterator[LogRecord]:
        """Every stored entry from `from_lsn` (default: just after the truncation point)."""
        lsn = self._driver.truncated() + 1 if from_lsn is None else from_lsn
        # the base class's entry-by-entry `runs`, whatever the backend overrides it with
        for r in LogDriver.runs(self._driver, lsn, max_bytes):
            assert isinstance(r, LogRecord)
            yield r

    def runs(self, from_lsn: int | None = None) -> Iterator[LogRecord | RecordRun]:
        """`records`, except that entries stored together may come as one `RecordRun`
        (replay applies those a record at a time)."""
        lsn = self._driver.truncated() + 1 if from_lsn is None else from_lsn
        return self._driver.runs(lsn)

    def truncate(self, lsn: int) -> None:
        self._driver.truncate(lsn)

    def truncated(self) -> int:
        return self._driver.truncated()

    def close(self) -> None:
        self._driver.close()

