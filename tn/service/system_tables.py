"""The TN's exactly-once bookkeeping, in two system tables of its own.

The WAL schema cannot carry request ids, so the TN keeps its bookkeeping in
two system tables of its own, written through the engine and therefore in the
WAL, atomically with the user's writes:

- ``kwal_system.requests(request_id PK, req_offset)``: every request's
  transaction also inserts its id. So "the request's effects are committed"
  and "its id is in this table" are the same fact, and the primary key makes
  a second execution of the same id conflict.
- ``kwal_system.progress(k PK, requests_offset, results_offset)``: one row,
  rewritten by a small transaction about every `progress_interval_s`.
  ``requests_offset`` (C) is the lowest requests-topic offset whose result the
  broker has not acknowledged yet: every request below C is *resolved*.
  ``results_offset`` (R) is at or below the results-topic offset of every
  result already delivered for a request at or above C. The same transaction
  deletes ``requests`` rows more than `dedup_window` (100,000) offsets below
  C, so that table stays bounded. (`dedup_window` is `tn.dedup_window`.)

On start (after ``Engine.recover``) the TN reads both tables, then reads the
results topic from R to its end to learn which requests at or above C already
got an answer, and resumes consuming at C. For each request from C on:

1. a result for this record (its request offset) is on the results topic -> skip;
   a result for another copy of its id -> publish that result again for this
   copy (an aborted request is never re-executed, so it can never commit later);
2. its id is in ``kwal_system.requests`` -> committed before the crash but
   unanswered: publish ``committed`` again, with the commit ts found by a
   binary search over snapshot reads;
3. otherwise run it (it had no effect before the crash).

Guarantees: a request's writes are applied at most once, also when a client
re-sends the same request id, as long as the first copy is among the last
`dedup_window` requests; the repeat gets the first one's result again (a copy that arrives
while the first is still committing waits for it and gets its result). Every
request record consumed gets at least one result; a client can receive a result twice
(clients take the first and ignore the rest). A duplicate id arriving later
than that horizon is executed again.

Across a restart: a committed id is known from ``kwal_system.requests`` (its row was
in the WAL entry of the commit, and is in every checkpoint taken since, so replay
rebuilds it). An aborted id wrote nothing to the WAL: its outcome is known from the
results topic, which the restart scan reads back far enough to cover the window
(results of requests at or above C - `dedup_window`), as long as the topic's retention
keeps them.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from tn.catalog.nodes import SYSTEM_DB
from tn.exceptions import TnError
from tn.txn.rows import Columns

REQUESTS_TABLE = "requests"
PROGRESS_TABLE = "progress"
PROGRESS_KEY = "tn"


def create_system_tables(engine: Any) -> bool:
    """Create both tables (C and R at -1) unless they exist; True if they were created
    (a fresh TN: nothing to recover)."""
    tables = engine.tables()
    if REQUESTS_TABLE in tables.get(SYSTEM_DB, []):
        return False
    txn = engine.begin()
    if SYSTEM_DB not in tables:
        txn.create_database(SYSTEM_DB)
    txn.create_table(
        SYSTEM_DB,
        REQUESTS_TABLE,
        [("request_id", "string"), ("req_offset", "int64")],
        "request_id",
    )
    txn.create_table(
        SYSTEM_DB,
        PROGRESS_TABLE,
        [("k", "string"), ("requests_offset", "int64"), ("results_offset", "int64")],
        "k",
    )
    txn.insert(
        SYSTEM_DB,
        PROGRESS_TABLE,
        [{"k": PROGRESS_KEY, "requests_offset": -1, "results_offset": -1}],
    )
    txn.commit().result(timeout=60)
    return True


def read_progress(engine: Any) -> tuple[int, int]:
    """(C, R) as last recorded; (-1, -1) before the first record."""
    c, r = -1, -1
    for row in engine.read(SYSTEM_DB, PROGRESS_TABLE).to_pylist():
        if row["k"] == PROGRESS_KEY:
            c, r = int(row["requests_offset"]), int(row["results_offset"])
    return c, r


def committed_requests(engine: Any) -> list[tuple[int, str]]:
    """(request offset, request id) of every committed request still in the window."""
    return [
        (int(row["req_offset"]), row["request_id"])
        for row in engine.read(SYSTEM_DB, REQUESTS_TABLE).to_pylist()
    ]


def record_requests(txn: Any, requests: list[tuple[str, int]]) -> None:
    """Insert (request id, request offset) rows in the transaction that runs them: their
    effects and their ids commit together, and a second run of an id conflicts."""
    txn.insert(
        SYSTEM_DB,
        REQUESTS_TABLE,
        Columns(
            {
                "request_id": [rid for rid, _ in requests],
                "req_offset": [offset for _, offset in requests],
            }
        ),
    )


def commit_progress(engine: Any, c: int, r: int, prune: list[str]) -> Future[int]:
    """Record (C, R) and drop the ids in `prune` (below C - dedup_window) in one
    transaction; returns its commit future."""
    txn = engine.begin()
    txn.update(
        SYSTEM_DB,
        PROGRESS_TABLE,
        [{"k": PROGRESS_KEY, "requests_offset": c, "results_offset": r}],
    )
    if prune:
        txn.delete(SYSTEM_DB, REQUESTS_TABLE, prune)
    fut: Future[int] = txn.commit()
    return fut


def find_commit_ts(engine: Any, request_id: str) -> int:
    """The commit ts of the transaction that inserted `request_id` (binary search over
    snapshot reads); 0 if it is not committed."""
    lo, hi = 0, engine.now()

    def visible(ts: int) -> bool:
        try:
            t = engine.read(SYSTEM_DB, REQUESTS_TABLE, ts)
        except TnError:  # the system tables did not exist yet at ts
            return False
        return request_id in set(t.column("request_id").to_pylist())

    if not visible(hi):
        return 0
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if visible(mid):
            hi = mid
        else:
            lo = mid
    return hi
