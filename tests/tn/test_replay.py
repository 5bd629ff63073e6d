"""Replay rebuilds the same physical state: catalog ids and timestamps, blocks, row offsets,
commit ts and delete masks."""

from __future__ import annotations

import random
import threading

import pyarrow as pa

from tests.tn.helpers import new_engine, setup_table
from tn.catalog.nodes import ABORTED_TS
from tn.engine import Engine
from tn.exceptions import TnError
from tn.replay import physical_state


def _workload(e: Engine) -> None:
    setup_table(e, "db", "t")
    txn = e.begin()
    txn.create_database("db2")
    txn.create_table("db2", "w", [("k", "string"), ("n", "int64"), ("b", "bool")], "k")
    txn.insert("db2", "w", [{"k": "a", "n": 1, "b": True}])
    txn.create_table("db2", "gone", [("id", "int64")], "id")
    txn.insert("db2", "gone", [{"id": 1}])
    txn.drop_table("db2", "gone")  # created and dropped in one transaction
    txn.commit().result(timeout=10)
    # a big insert spanning blocks
    n = 9000
    txn = e.begin()
    txn.insert("db", "t", pa.table({"id": pa.array(range(n), pa.int64()), "v": ["big"] * n}))
    txn.commit().result(timeout=30)

    # concurrent clients with conflicts, rollbacks and deletes -> holes in blocks
    def client(i: int) -> None:
        rng = random.Random(i)
        for j in range(40):
            txn = e.begin()
            try:
                r = rng.random()
                if r < 0.5:
                    txn.insert("db", "t", [{"id": 100_000 + rng.randrange(300), "v": f"{i}.{j}"}])
                elif r < 0.7:
                    txn.update("db", "t", [{"id": rng.randrange(n), "v": f"u{i}.{j}"}])
                else:
                    txn.delete("db", "t", [rng.randrange(n), 100_000 + rng.randrange(300)])
                if rng.random() < 0.15:
                    txn.rollback()
                    continue
                txn.commit().result(timeout=30)
            except TnError:
                txn.rollback()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    txn = e.begin()
    txn.add_column("db2", "w", "extra", "float64")
    txn.insert("db2", "w", [{"k": "b", "n": 2, "extra": 0.5}])
    txn.drop_column("db2", "w", "b")
    txn.insert("db2", "w", [{"k": "c", "n": 3}])
    txn.commit().result(timeout=10)
    setup_table(e, "db3", "x")
    txn = e.begin()
    txn.insert("db3", "x", [{"id": 1, "v": "doomed"}])
    txn.commit().result(timeout=10)
    txn = e.begin()
    txn.drop_database("db3")
    txn.commit().result(timeout=10)


def test_replay_reproduces_physical_state():
    e, log = new_engine()
    _workload(e)
    before = physical_state(e.catalog)
    # the workload did leave holes (rolled back / conflicting rows) for replay to reproduce
    holes = sum(
        1
        for node in e.catalog.nodes.values()
        if hasattr(node, "mem") and hasattr(node.mem, "cts")
        for c in node.mem.cts
        if c == ABORTED_TS
    )
    assert holes > 0
    e.close()
    r = Engine.recover(log)
    assert physical_state(r.catalog) == before
    assert r.visible_ts == e.visible_ts
    for db, tables in e.tables().items():
        for t in tables:
            assert r.read(db, t).equals(e.read(db, t))
            assert r.schema(db, t) == e.schema(db, t)
    assert r.tables() == e.tables() and "db3" not in r.tables()
    # the recovered engine continues: new ids above every replayed one, later timestamps
    max_id = max(e.catalog.nodes)
    txn = r.begin()
    txn.insert("db", "t", [{"id": -1, "v": "after"}])
    txn.create_table("db", "t2", [("id", "int64")], "id")
    ts = txn.commit().result(timeout=10)
    assert ts > e.visible_ts
    assert min(i for i in r.catalog.nodes if i not in e.catalog.nodes) > max_id
    # conflict detection survives replay (the primary-key index was rebuilt)
    a = r.begin()
    b = r.begin()
    a.delete("db", "t", [5])
    b.update("db", "t", [{"id": 5, "v": "b"}])
    a.commit().result(timeout=10)
    try:
        b.commit().result(timeout=10)
        raise AssertionError("expected a conflict")
    except TnError as err:
        assert err.code == "write_conflict"
    # and a second replay of the longer log matches again
    again = Engine.recover(log)
    assert physical_state(again.catalog) == physical_state(r.catalog)


def test_replay_of_empty_log():
    e, log = new_engine()
    r = Engine.recover(log)
    assert r.tables() == {} and r.visible_ts == 0
    setup_table(r)
    assert physical_state(Engine.recover(log).catalog) == physical_state(r.catalog)


def test_all_column_types_round_trip_through_the_wal():
    import datetime as dt

    e, log = new_engine()
    cols = [
        ("id", "int64"),
        ("f", "float64"),
        ("s", "string"),
        ("b", "bool"),
        ("bin", "binary"),
        ("ts", "timestamp"),
    ]
    txn = e.begin()
    txn.create_database("db")
    txn.create_table("db", "all", cols, "id")
    txn.commit().result(timeout=10)
    when = dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    txn = e.begin()
    txn.insert(
        "db",
        "all",
        [
            {"id": 1, "f": 1.5, "s": "é", "b": True, "bin": b"\x00\xff", "ts": when},
            {"id": 2, "f": 2, "s": None, "b": False, "bin": None, "ts": 1_000_000},
            {"id": 3},
        ],
    )
    txn.commit().result(timeout=10)
    txn = e.begin()
    txn.insert(
        "db",
        "all",
        pa.table(
            {
                "id": pa.array([4], pa.int64()),
                "ts": pa.array([when], pa.timestamp("us", tz="UTC")),
                "bin": pa.array([b"x"], pa.binary()),
            }
        ),
    )
    txn.commit().result(timeout=10)
    got = e.read("db", "all")
    assert got.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    rows = got.to_pylist()
    assert rows[0] == {"id": 1, "f": 1.5, "s": "é", "b": True, "bin": b"\x00\xff", "ts": when}
    assert rows[1]["f"] == 2.0 and rows[1]["ts"] == dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC)
    assert rows[2] == {"id": 3, "f": None, "s": None, "b": None, "bin": None, "ts": None}
    assert rows[3]["ts"] == when and rows[3]["bin"] == b"x"
    r = Engine.recover(log)
    assert physical_state(r.catalog) == physical_state(e.catalog)
    assert r.read("db", "all").equals(got)
