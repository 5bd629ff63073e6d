"""Concurrent transactions: conflicts, visibility order, snapshot consistency, log failures."""

from __future__ import annotations

import random
import threading
import time

import pytest

from schemas.codec import decode_entry
from schemas.wal import WalEntry
from tests.tn.helpers import GroupCommitDriver, HeldDriver, new_engine, setup_table
from tn.engine import Engine
from tn.exceptions import ConflictError, EngineClosedError, LogFailedError, TnError
from tn.logstore.driver import LogStore


def _contend(e: Engine, op: str) -> list[object]:
    """Two threads write key 7 with `op` and commit at the same moment."""
    barrier = threading.Barrier(2)
    outcomes: list[object] = []

    def client(name: str) -> None:
        txn = e.begin()
        if op == "insert":
            txn.insert("db", "t", [{"id": 7, "v": name}])
        elif op == "update":
            txn.update("db", "t", [{"id": 7, "v": name}])
        else:
            txn.delete("db", "t", [7])
        barrier.wait()
        try:
            outcomes.append(txn.commit().result(timeout=10))
        except ConflictError as err:
            outcomes.append(err)

    threads = [threading.Thread(target=client, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


@pytest.mark.parametrize("op", ["insert", "update", "delete"])
def test_write_write_conflict_aborts_exactly_one(op: str) -> None:
    for _ in range(5):
        e, _log = new_engine()
        setup_table(e)
        if op != "insert":
            txn = e.begin()
            txn.insert("db", "t", [{"id": 7, "v": "orig"}])
            txn.commit().result(timeout=10)
        outcomes = _contend(e, op)
        errors = [o for o in outcomes if isinstance(o, ConflictError)]
        assert len(errors) == 1, (op, outcomes)
        assert errors[0].code == "write_conflict"
        got = e.read("db", "t").to_pylist()
        if op == "delete":
            assert got == []
        else:
            assert len(got) == 1 and got[0]["v"] in ("a", "b")


def test_non_conflicting_transactions_all_commit():
    e, _ = new_engine()
    setup_table(e)
    n_threads, per = 16, 20
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            for j in range(per):
                txn = e.begin()
                txn.insert("db", "t", [{"id": i * 1000 + j, "v": "x"}])
                txn.commit().result(timeout=30)
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert e.read("db", "t").num_rows == n_threads * per


@pytest.mark.parametrize("backend", ["memory", "group_commit"])
def test_visibility_order_is_lsn_order_and_snapshots_are_consistent(backend: str) -> None:
    """64 client threads commit 1-row inserts (some conflicting, some rolled back) while
    readers take snapshots. Checks: listener order == LSN order == CommitTS order; each
    future completes only once visible; a reader at ts sees exactly the rows of the
    transactions that committed at or before ts and never an aborted one."""
    if backend == "memory":
        e, log = new_engine(commit_queue=32)
    else:
        driver = GroupCommitDriver()
        log = LogStore(driver)
        e = Engine(log, commit_queue=32)
    setup_table(e)
    seen: list[tuple[int, int]] = []
    e.add_commit_listener(lambda entry: seen.append((entry.lsn, entry.txn.commit_ts)))
    lock = threading.Lock()
    committed: dict[int, int] = {}  # key -> commit ts
    aborted: set[tuple[int, str]] = set()
    stop = threading.Event()
    bad: list[str] = []
    snapshots: list[tuple[int, frozenset[tuple[int, str]]]] = []

    def client(i: int) -> None:
        rng = random.Random(i)
        for j in range(15):
            key = rng.randrange(400)  # collisions -> conflicts / duplicates
            val = f"{i}-{j}"
            txn = e.begin()
            try:
                txn.insert("db", "t", [{"id": key, "v": val}])
            except Exception:
                txn.rollback()
                continue
            if rng.random() < 0.1:
                txn.rollback()
                with lock:
                    aborted.add((key, val))
                continue
            try:
                ts = txn.commit().result(timeout=30)
            except ConflictError:
                with lock:
                    aborted.add((key, val))
                continue
            # visible as soon as the future completes
            if (key, val) not in {(r["id"], r["v"]) for r in e.read("db", "t").to_pylist()}:
                bad.append(f"{key} not visible after commit at {ts}")
            with lock:
                committed[key] = ts

    def reader() -> None:
        while not stop.is_set():
            ts = e.now() if random.random() < 0.5 else e.visible_ts
            got = frozenset((r["id"], r["v"]) for r in e.read("db", "t", ts).to_pylist())
            snapshots.append((ts, got))
            time.sleep(0.001)

    readers = [threading.Thread(target=reader) for _ in range(2)]
    clients = [threading.Thread(target=client, args=(i,)) for i in range(64)]
    for t in readers + clients:
        t.start()
    for t in clients:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert bad == []
    lsns = [lsn for lsn, _ in seen]
    stamps = [ts for _, ts in seen]
    assert lsns == sorted(lsns) and len(set(lsns)) == len(lsns)
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    # the WAL holds exactly the committed transactions, in commit-ts order
    entries = [decode_entry(r.payload) for r in log.records()]
    assert [(x.lsn, x.txn.commit_ts) for x in entries[1:]] == seen
    assert len(seen) == len(committed)
    final = {(r["id"], r["v"]) for r in e.read("db", "t").to_pylist()}
    assert {k for k, _ in final} == set(committed)
    assert not (final & aborted)
    by_key = {k: v for k, v in final}
    for ts, got in snapshots:
        expect = {(k, by_key[k]) for k, cts in committed.items() if cts <= ts}
        assert got == expect, ts
    e.close()
    log.close()


def test_back_pressure_bounded_queue():
    driver = HeldDriver()
    e = Engine(LogStore(driver), commit_queue=4)
    setup_table(e)
    driver.hold = True
    futures = []
    done = threading.Event()

    def client() -> None:
        for i in range(6):
            txn = e.begin()
            txn.insert("db", "t", [{"id": i, "v": "x"}])
            futures.append(txn.commit())
        done.set()

    t = threading.Thread(target=client)
    t.start()
    deadline = time.time() + 10
    while e.pipeline.in_flight() < 4 and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert not done.is_set()  # blocked: 4 commits in flight, none durable
    assert e.pipeline.in_flight() == 4
    assert e.read("db", "t").num_rows == 0
    driver.release()
    time.sleep(0.1)
    driver.release()
    t.join(10)
    assert done.is_set()
    driver.release()
    assert [f.result(timeout=10) > 0 for f in futures] == [True] * 6
    assert e.read("db", "t").num_rows == 6


def test_failed_append_aborts_it_and_every_later_in_flight_one():
    driver = HeldDriver()
    e = Engine(LogStore(driver))
    setup_table(e)  # LSN 1
    txn = e.begin()
    txn.insert("db", "t", [{"id": 0, "v": "ok"}])
    ok_ts = txn.commit().result(timeout=10)  # LSN 2
    driver.hold = True
    driver.fail = {4}
    futures = []
    for i in range(1, 5):  # LSNs 3..6
        txn = e.begin()
        txn.insert("db", "t", [{"id": i, "v": "x"}])
        futures.append(txn.commit())
    deadline = time.time() + 10
    while e.pipeline.in_flight() < 4 and time.time() < deadline:
        time.sleep(0.01)
    driver.release()  # LSN 3 ok, 4 fails, 5 and 6 "succeed" at the driver
    assert futures[0].result(timeout=10) > ok_ts
    for f in futures[1:]:
        with pytest.raises(LogFailedError):
            f.result(timeout=10)
    assert [r["id"] for r in e.read("db", "t", e.now()).to_pylist()] == [0, 1]
    with pytest.raises(EngineClosedError):
        e.begin()


def test_reader_at_ts_waits_for_in_flight_commits():
    driver = HeldDriver()
    e = Engine(LogStore(driver))
    setup_table(e)
    driver.hold = True
    txn = e.begin()
    txn.insert("db", "t", [{"id": 1, "v": "x"}])
    fut = txn.commit()
    deadline = time.time() + 10
    while e.pipeline.in_flight() < 1 and time.time() < deadline:
        time.sleep(0.01)
    ts = e.now()
    assert e.read("db", "t").num_rows == 0  # latest visible: not yet durable
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(e.read("db", "t", ts).num_rows))
    t.start()
    time.sleep(0.2)
    assert result == []  # waits: a commit with CommitTS <= ts is in flight
    driver.release()
    t.join(10)
    assert result == [1]
    assert fut.result(timeout=10) < ts


def test_unencodable_entry_aborts_only_that_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    import tn.commit.pipeline as pipeline
    from tn.replay import physical_state

    e, log = new_engine()
    setup_table(e)
    real = pipeline.encode_entry
    calls = {"n": 0}

    def flaky(entry: WalEntry) -> bytes:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("boom")
        return real(entry)

    monkeypatch.setattr(pipeline, "encode_entry", flaky)
    txn = e.begin()
    txn.create_table("db", "u", [("id", "int64")], "id")
    txn.insert("db", "t", [{"id": 1, "v": "lost"}])
    with pytest.raises(TnError) as ei:
        txn.commit().result(timeout=10)
    assert ei.value.code == "internal"
    # nothing of it is visible or logged, and the engine goes on (same key, same table name)
    assert e.read("db", "t", e.now()).num_rows == 0
    txn = e.begin()
    txn.create_table("db", "u", [("id", "int64")], "id")
    txn.insert("db", "t", [{"id": 1, "v": "kept"}])
    txn.commit().result(timeout=10)
    assert e.read("db", "t").to_pylist() == [{"id": 1, "v": "kept"}]
    assert e.tables() == {"db": ["t", "u"]}
    assert physical_state(Engine.recover(log).catalog) == physical_state(e.catalog)


def test_heartbeats_are_ordered_with_commits() -> None:
    driver = GroupCommitDriver(seed=3)
    log = LogStore(driver)
    e = Engine(log)
    setup_table(e)
    events: list[tuple[str, int]] = []
    e.add_commit_listener(lambda entry: events.append(("commit", entry.txn.commit_ts)))
    e.add_heartbeat_listener(lambda ts: events.append(("heartbeat", ts)))
    stop = threading.Event()
    beats: list[int] = []

    def heartbeats() -> None:
        while not stop.is_set():
            ts = e.heartbeat().result(timeout=10)
            assert e.visible_ts >= ts
            beats.append(ts)
            time.sleep(0.001)

    def client(i: int) -> None:
        for j in range(20):
            txn = e.begin()
            txn.insert("db", "t", [{"id": i * 100 + j, "v": "x"}])
            txn.commit().result(timeout=10)

    hb = threading.Thread(target=heartbeats)
    hb.start()
    clients = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    stop.set()
    hb.join()
    stamps = [ts for _, ts in events]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert sum(1 for k, _ in events if k == "commit") == 16 * 20
    assert [ts for k, ts in events if k == "heartbeat"] == beats and beats
    # heartbeats write nothing to the WAL
    assert len(list(log.records())) == 1 + 16 * 20
    e.close()
    log.close()
    with pytest.raises(EngineClosedError):
        e.heartbeat()
