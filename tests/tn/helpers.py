"""Shared helpers for the engine tests."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import Future

from tn.engine import Engine
from tn.logstore.driver import LogClosedError, LogDriver, LogRecord, LogStore
from tn.logstore.memory_backend import MemoryDriver


def new_engine(**kw: int) -> tuple[Engine, LogStore]:
    log = LogStore(MemoryDriver())
    return Engine(log, **kw), log


def setup_table(engine: Engine, db: str = "db", table: str = "t") -> int:
    txn = engine.begin()
    if db not in engine.tables():
        txn.create_database(db)
    txn.create_table(db, table, [("id", "int64"), ("v", "string")], "id")
    return txn.commit().result(timeout=10)


class HeldDriver(LogDriver):
    """A MemoryDriver whose futures complete only when the test releases them (in LSN
    order), optionally failing chosen LSNs: simulates a slow or failing backend."""

    def __init__(self) -> None:
        self.inner = MemoryDriver()
        self.lock = threading.Lock()
        self.pending: list[tuple[int, Future[int]]] = []
        self.fail: set[int] = set()
        self.hold = False

    def append(self, lsn: int, payload: bytes) -> Future[int]:
        with self.lock:
            if not self.hold:
                if lsn in self.fail:
                    f: Future[int] = Future()
                    f.set_exception(OSError(f"disk on fire at LSN {lsn}"))
                    self.inner.append(lsn, payload)  # keep LSNs contiguous in the inner log
                    return f
                return self.inner.append(lsn, payload)
            self.inner.append(lsn, payload)
            fut: Future[int] = Future()
            self.pending.append((lsn, fut))
            return fut

    def release(self) -> None:
        """Complete every held future, in LSN order (failing those in `fail`)."""
        with self.lock:
            pending, self.pending = self.pending, []
            self.hold = False
        for lsn, fut in pending:
            if lsn in self.fail:
                fut.set_exception(OSError(f"disk on fire at LSN {lsn}"))
            else:
                fut.set_result(lsn)

    def read(self, from_lsn: int, max_bytes: int) -> tuple[list[LogRecord], int]:
        return self.inner.read(from_lsn, max_bytes)

    def truncate(self, lsn: int) -> None:
        self.inner.truncate(lsn)

    def truncated(self) -> int:
        return self.inner.truncated()

    def last_lsn(self) -> int:
        return self.inner.last_lsn()

    def close(self) -> None:
        self.inner.close()


class GroupCommitDriver(HeldDriver):
    """Completes futures from a background flusher thread, a group at a time, in LSN
    order, after a short random delay: like a real backend's group commit."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.hold = True
        self._stop = threading.Event()
        self._rng = random.Random(seed)
        self._thread = threading.Thread(target=self._flush, daemon=True)
        self._thread.start()

    def _flush(self) -> None:
        while not self._stop.is_set():
            time.sleep(self._rng.uniform(0.0002, 0.003))
            with self.lock:
                pending, self.pending = self.pending, []
            for lsn, fut in pending:
                fut.set_result(lsn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        with self.lock:
            pending, self.pending = self.pending, []
        for lsn, fut in pending:
            fut.set_result(lsn)
        super().close()


__all__ = ["GroupCommitDriver", "HeldDriver", "LogClosedError", "new_engine", "setup_table"]
