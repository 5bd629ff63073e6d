"""Committing clients for broker fault tests, each commit recorded with its times.

`workers` threads each commit one single-row insert after another (a fresh key each,
`commit(timeout=timeout_s)`); every attempt is recorded as a `Commit`: when it was
sent, when its answer (or the client's timeout) came, and the outcome. What the
fault tests ask of it: which commits were acknowledged, aborted or left unknown
(the client's TimeoutError), and when the first commit sent after some moment (a
broker killed, a broker back) was acknowledged.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from producers import Client, ProducerError
from producers import TimeoutError as ClientTimeout


@dataclass(frozen=True)
class Commit:
    key: int
    worker: int
    sent: float  # time.monotonic() before commit()
    done: float  # time.monotonic() when commit() returned or raised
    request_id: str
    ts: int = 0  # the acknowledged commit ts; 0: not acknowledged
    error: ProducerError | None = None

    @property
    def acked(self) -> bool:
        return self.error is None

    @property
    def unknown(self) -> bool:
        """The client's timeout: the outcome is unknown (it may still commit)."""
        return isinstance(self.error, ClientTimeout)


class CommitLoad:
    """`timeout_s` may be changed while the load runs: each commit takes the value it
    finds when it starts. `pause_s`: each worker waits this long between its commits
    (a steady load that leaves the machine's cores to the brokers it is about)."""

    def __init__(
        self, client: Client, table: str, workers: int = 4, timeout_s: float = 30.0, pause_s: float = 0.0
    ) -> None:
        self.client = client
        self.table = table
        self.timeout_s = timeout_s
        self.pause_s = pause_s
        self._lock = threading.Lock()
        self._commits: list[Commit] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(w,), name=f"load-{w}", daemon=True)
            for w in range(workers)
        ]

    def start(self) -> CommitLoad:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        """Let each worker finish its commit in flight (bounded by its timeout)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.timeout_s + 10)
            assert not t.is_alive(), f"{t.name} still in a commit {self.timeout_s + 10:.0f}s after stop"

    def _run(self, worker: int) -> None:
        i = 0
        while not self._stop.is_set():
            key = worker * 10_000_000 + i
            i += 1
            txn = self.client.begin().insert(self.table, [{"id": key}])
            sent = time.monotonic()
            try:
                res = txn.commit(timeout=self.timeout_s)
                commit = Commit(key, worker, sent, time.monotonic(), txn.request_id, ts=res.commit_ts)
            except ProducerError as e:
                commit = Commit(key, worker, sent, time.monotonic(), txn.request_id, error=e)
            with self._lock:
                self._commits.append(commit)
            if self.pause_s:
                self._stop.wait(self.pause_s)

    def commits(self) -> list[Commit]:
        with self._lock:
            return list(self._commits)

    def acked(self) -> list[Commit]:
        return [c for c in self.commits() if c.acked]

    def first_ack_sent_after(self, t: float) -> Commit | None:
        """The earliest-answered acknowledged commit among those sent after `t`."""
        after = [c for c in self.commits() if c.acked and c.sent > t]
        return min(after, key=lambda c: c.done) if after else None
