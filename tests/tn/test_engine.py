"""Single-threaded behaviour of the engine: DDL, DML, snapshots, validation."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest

from infra.processes import REPO
from tests.tn.helpers import new_engine, setup_table
from tn.exceptions import ConflictError, EngineClosedError, TxnClosedError, ValidationError
from tn.txn.rows import Columns


def rows(engine, db="db", table="t", ts=None):
    return engine.read(db, table, ts).to_pylist()


def test_insert_read_sorted_by_key():
    e, _ = new_engine()
    setup_table(e)
    txn = e.begin()
    txn.insert("db", "t", [{"id": 3, "v": "c"}, {"id": 1, "v": "a"}])
    txn.insert("db", "t", pa.table({"id": pa.array([2], pa.int32()), "v": ["b"]}))
    ts = txn.commit().result(timeout=10)
    assert ts == e.visible_ts
    assert rows(e) == [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 3, "v": "c"}]
    assert e.tables() == {"db": ["t"]}
    assert [c.name for c in e.schema("db", "t").columns] == ["id", "v"]


def test_uncommitted_invisible_and_own_writes_not_readable_by_others():
    e, _ = new_engine()
    setup_table(e)
    txn = e.begin()
    txn.insert("db", "t", [{"id": 1, "v": "a"}])
    assert rows(e) == []
    assert rows(e, ts=e.now()) == []
    txn.rollback()
    assert rows(e, ts=e.now()) == []
    with pytest.raises(TxnClosedError):
        txn.insert("db", "t", [{"id": 2}])


def test_snapshot_reads_at_ts():
    e, _ = new_engine()
    t0 = setup_table(e)
    stamps = []
    for i in range(5):
        txn = e.begin()
        txn.insert("db", "t", [{"id": i, "v": str(i)}])
        stamps.append(txn.commit().result(timeout=10))
    assert stamps == sorted(stamps)
    assert rows(e, ts=t0) == []
    for i, ts in enumerate(stamps):
        assert [r["id"] for r in rows(e, ts=ts)] == list(range(i + 1))
        assert [r["id"] for r in rows(e, ts=ts - 1)] == list(range(i))
    with pytest.raises(ValidationError) as ei:
        e.read("db", "t", t0 - 1)
    assert ei.value.code == "unknown_database"


def test_update_and_delete():
    e, _ = new_engine()
    setup_table(e)
    txn = e.begin()
    txn.insert("db", "t", [{"id": i, "v": "x"} for i in range(5)])
    t1 = txn.commit().result(timeout=10)
    txn = e.begin()
    txn.update("db", "t", [{"id": 1, "v": "y"}, {"id": 9, "v": "new"}])
    txn.delete("db", "t", [2, 3, 42])  # 42 does not exist: no-op
    txn.delete("db", "t", [2])  # already deleted in this txn: no-op
    t2 = txn.commit().result(timeout=10)
    assert rows(e) == [
        {"id": 0, "v": "x"},
        {"id": 1, "v": "y"},
        {"id": 4, "v": "x"},
        {"id": 9, "v": "new"},
    ]
    assert [r["id"] for r in rows(e, ts=t1)] == [0, 1, 2, 3, 4]
    assert t2 > t1
    # insert then delete in one transaction: never visible
    txn = e.begin()
    txn.insert("db", "t", [{"id": 100, "v": "tmp"}])
    txn.delete("db", "t", [100])
    txn.insert("db", "t", [{"id": 2, "v": "again"}])  # deleted key can come back
    txn.commit().result(timeout=10)
    assert [r["id"] for r in rows(e)] == [0, 1, 2, 4, 9]


@pytest.mark.parametrize(
    ("rows_in", "code"),
    [
        ([{"id": 1, "nope": 1}], "bad_column"),
        ([{"v": "x"}], "missing_primary_key"),
        ([{"id": None, "v": "x"}], "missing_primary_key"),
        ([{"id": "one", "v": "x"}], "type_mismatch"),
        ([{"id": 1, "v": 5}], "type_mismatch"),
        ([{"id": 1.5, "v": "x"}], "type_mismatch"),
        ([{"id": 1 << 70, "v": "x"}], "type_mismatch"),
        ([{"id": 5, "v": "x"}, {"id": 5, "v": "y"}], "duplicate_key"),
        ([{"id": 1, "v": "dup"}], "duplicate_key"),
        (pa.table({"id": ["a"]}), "type_mismatch"),
        (pa.table({"v": ["a"]}), "missing_primary_key"),
        (pa.table({"id": [7], "zz": [1]}), "bad_column"),
        ("not rows", "bad_request"),
        # the column form (`Columns`: the TN's system-table rows) is held to the same rules
        (Columns({"id": [1], "nope": [1]}), "bad_column"),
        (Columns({"v": ["x"]}), "missing_primary_key"),
        (Columns({"id": [3, None], "v": ["x", "y"]}), "missing_primary_key"),
        (Columns({"id": ["one"], "v": ["x"]}), "type_mismatch"),
        (Columns({"id": [1.5], "v": ["x"]}), "type_mismatch"),
        (Columns({"id": [5, 5], "v": ["x", "y"]}), "duplicate_key"),
        (Columns({"id": [1], "v": ["dup"]}), "duplicate_key"),
        (Columns({"id": [3, 4], "v": ["x"]}), "bad_request"),
        (Columns({"id": (3,), "v": ("x",)}), "bad_request"),
    ],
)
def test_insert_validation(rows_in, code):
    e, _ = new_engine()
    setup_table(e)
    txn = e.begin()
    txn.insert("db", "t", [{"id": 1, "v": "a"}])
    txn.commit().result(timeout=10)
    txn = e.begin()
    with pytest.raises(ValidationError) as ei:
        txn.insert("db", "t", rows_in)
    assert ei.value.code == code
    # nothing changed and the transaction is still usable
    txn.insert("db", "t", [{"id": 2, "v": "b"}])
    txn.commit().result(timeout=10)
    assert [r["id"] for r in rows(e)] == [1, 2]


def test_insert_columns_equals_rows():
    """Rows given column by column (`Columns`) insert what the same rows as dicts do,
    an absent nullable column as nulls; the caller's lists are not the batch's."""
    e, _ = new_engine()
    setup_table(e)
    ids, vs = [3, 1, 2], ["c", "a", None]
    txn = e.begin()
    txn.insert("db", "t", Columns({"id": ids, "v": vs}))
    txn.insert("db", "t", Columns({"id": [7]}))
    txn.commit().result(timeout=10)
    ids.append(9)
    vs[0] = "changed"
    assert rows(e) == [
        {"id": 1, "v": "a"},
        {"id": 2, "v": None},
        {"id": 3, "v": "c"},
        {"id": 7, "v": None},
    ]


def test_unknown_objects_and_exists():
    e, _ = new_engine()
    setup_table(e)
    txn = e.begin()
    for call, code in [
        (lambda: txn.insert("nodb", "t", [{"id": 1}]), "unknown_database"),
        (lambda: txn.insert("db", "nope", [{"id": 1}]), "unknown_table"),
        (lambda: txn.delete("db", "t", ["x"]), "type_mismatch"),
        (lambda: txn.create_database("db"), "exists"),
        (lambda: txn.create_table("db", "t", [("id", "int64")], "id"), "exists"),
        (lambda: txn.create_table("db", "u", [("id", "int64")], "key"), "missing_primary_key"),
        (
            lambda: txn.create_table("db", "u", [("id", "int64"), ("id", "string")], "id"),
            "bad_column",
        ),
        (lambda: txn.create_table("db", "u", [("id", "uint8")], "id"), "bad_column"),
        (lambda: txn.drop_column("db", "t", "id"), "bad_column"),
        (lambda: txn.add_column("db", "t", "v", "string"), "exists"),
        (lambda: txn.drop_table("db", "nope"), "unknown_table"),
        (lambda: txn.drop_database("nodb"), "unknown_database"),
    ]:
        with pytest.raises(ValidationError) as ei:
            call()
        assert ei.value.code == code
    assert txn.commit().result(timeout=10) == txn.start_ts  # no writes: nothing logged


def test_ddl_and_dml_in_one_transaction_commit_atomically():
    e, log = new_engine()
    txn = e.begin()
    txn.create_database("app")
    txn.create_table("app", "users", [("id", "int64"), ("name", "string")], "id")
    txn.insert("app", "users", [{"id": 1, "name": "ann"}])
    txn.add_column("app", "users", "age", "int64")
    txn.insert("app", "users", [{"id": 2, "name": "bob", "age": 30}])
    before = e.now()
    assert e.tables(before) == {}
    ts = txn.commit().result(timeout=10)
    assert e.tables(ts - 1) == {}
    assert e.tables(ts) == {"app": ["users"]}
    assert rows(e, "app", "users", ts) == [
        {"id": 1, "name": "ann", "age": None},
        {"id": 2, "name": "bob", "age": 30},
    ]
    assert len(list(log.records())) == 1  # one WAL entry for the whole transaction


def test_rolled_back_ddl_leaves_nothing():
    e, log = new_engine()
    txn = e.begin()
    txn.create_database("x")
    txn.create_table("x", "t", [("id", "int64")], "id")
    txn.insert("x", "t", [{"id": 1}])
    txn.rollback()
    assert e.tables(e.now()) == {}
    txn = e.begin()
    txn.create_database("x")  # the name is free again
    txn.commit().result(timeout=10)
    assert e.tables() == {"x": []}
    assert len(list(log.records())) == 1


def test_drop_table_hides_rows_later_not_earlier():
    e, _ = new_engine()
    setup_table(e)
    txn = e.begin()
    txn.insert("db", "t", [{"id": 1, "v": "a"}])
    t1 = txn.commit().result(timeout=10)
    txn = e.begin()
    txn.drop_table("db", "t")
    t2 = txn.commit().result(timeout=10)
    assert rows(e, ts=t1) == [{"id": 1, "v": "a"}]
    assert rows(e, ts=t2 - 1) == [{"id": 1, "v": "a"}]
    with pytest.raises(ValidationError) as ei:
        e.read("db", "t", t2)
    assert ei.value.code == "unknown_table"
    assert e.tables(t2) == {"db": []}
    # a new table of the same name starts empty; the old one is still readable in the past
    setup_table(e)
    assert rows(e) == []
    assert rows(e, ts=t1) == [{"id": 1, "v": "a"}]


def test_drop_database_drops_its_tables():
    e, _ = new_engine()
    t0 = setup_table(e)
    txn = e.begin()
    txn.drop_database("db")
    t1 = txn.commit().result(timeout=10)
    assert e.tables(t0) == {"db": ["t"]}
    assert e.tables(t1) == {}


def test_alter_table_versions_schema():
    e, _ = new_engine()
    setup_table(e)
    txn = e.begin()
    txn.insert("db", "t", [{"id": 1, "v": "a"}])
    t1 = txn.commit().result(timeout=10)
    txn = e.begin()
    txn.add_column("db", "t", "n", "float64")
    txn.drop_column("db", "t", "v")
    txn.insert("db", "t", [{"id": 2, "n": 2}])
    t2 = txn.commit().result(timeout=10)
    assert rows(e, ts=t1) == [{"id": 1, "v": "a"}]
    assert rows(e, ts=t2) == [{"id": 1, "n": None}, {"id": 2, "n": 2.0}]
    txn = e.begin()
    txn.add_column("db", "t", "v", "int64")  # a new column with a reused name: no old values
    txn.commit().result(timeout=10)
    assert rows(e) == [{"id": 1, "n": None, "v": None}, {"id": 2, "n": 2.0, "v": None}]
    ids = [c.column_id for c in e.schema("db", "t").columns]
    assert len(set(ids)) == 3 and ids[-1] == 4


def test_concurrent_ddl_conflicts():
    e, _ = new_engine()
    setup_table(e)
    a, b = e.begin(), e.begin()
    a.add_column("db", "t", "x", "int64")
    b.insert("db", "t", [{"id": 1, "v": "a"}])
    a.commit().result(timeout=10)
    with pytest.raises(ConflictError) as ei:
        b.commit().result(timeout=10)
    assert ei.value.code == "ddl_conflict"
    assert rows(e) == []
    # two creates of one name: the second loses
    a, b = e.begin(), e.begin()
    a.create_table("db", "u", [("id", "int64")], "id")
    b.create_table("db", "u", [("id", "string")], "id")
    a.commit().result(timeout=10)
    with pytest.raises(ConflictError):
        b.commit().result(timeout=10)
    # DML that committed first does not stop a later drop
    a, b = e.begin(), e.begin()
    a.insert("db", "u", [{"id": 1}])
    b.drop_table("db", "u")
    a.commit().result(timeout=10)
    b.commit().result(timeout=10)
    assert e.tables() == {"db": ["t"]}


def test_large_insert_spans_blocks():
    e, _ = new_engine()
    setup_table(e)
    n = 20_000
    txn = e.begin()
    txn.insert("db", "t", pa.table({"id": pa.array(range(n), pa.int64()), "v": ["x"] * n}))
    txn.commit().result(timeout=30)
    t = e.read("db", "t")
    assert t.num_rows == n and t.column("id").to_pylist() == list(range(n))
    db = e.catalog.database("db", e.visible_ts)
    assert db is not None
    table = e.catalog.table(db, "t", e.visible_ts)
    assert table is not None
    assert [len(b.mem) for b in table.mem.blocks] == [8192, 8192, n - 2 * 8192]


def test_close_refuses_new_work():
    e, _ = new_engine()
    setup_table(e)
    txn = e.begin()
    txn.insert("db", "t", [{"id": 1, "v": "a"}])
    e.close()
    with pytest.raises(EngineClosedError):
        e.begin()
    with pytest.raises(EngineClosedError):
        txn.commit().result(timeout=10)


def test_the_first_commit_imports_nothing_more():
    """The engine pays pyarrow's lazy imports (pandas, ~0.4 s) when it is made, not
    inside the first transaction that carries rows (a fresh interpreter, so nothing
    is imported already)."""
    code = """
import sys
from tn.engine import Engine
from tn.logstore.driver import LogStore
from tn.logstore.memory_backend import MemoryDriver
e = Engine(LogStore(MemoryDriver()))
t = e.begin(); t.create_database("db")
t.create_table("db", "t", [("id", "int64"), ("v", "string")], "id"); t.commit().result(30)
before = set(sys.modules)
t = e.begin(); t.insert("db", "t", [{"id": 1, "v": "a"}]); t.commit().result(30)
print(sorted(set(sys.modules) - before))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_columnar_insert_checks_keys_as_a_small_one_does():
    """An Arrow insert of COLUMNAR_MIN rows or more stays columnar (numpy key checks): the
    same verdicts as row by row -- repeats in the batch, keys live at StartTS or inserted
    earlier in the transaction, a delete then insert of its own rows, write conflicts --
    and the same rows after a replay."""
    from tn.engine import Engine
    from tn.txn.rows import COLUMNAR_MIN

    def batch(ids):
        return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})

    e, log = new_engine()
    setup_table(e)
    n = COLUMNAR_MIN
    txn = e.begin()
    txn.insert("db", "t", batch(list(range(n - 1, -1, -1))))  # descending: sorted by numpy
    txn.commit().result(timeout=10)
    for ids in (list(range(n, 2 * n)) + [n], list(range(n - 1, 2 * n))):
        txn = e.begin()
        with pytest.raises(ValidationError) as ei:
            txn.insert("db", "t", batch(ids))
        assert ei.value.code == "duplicate_key"
        txn.rollback()
    txn = e.begin()
    txn.insert("db", "t", batch(list(range(n, 2 * n))))
    with pytest.raises(ValidationError) as ei:
        txn.insert("db", "t", batch(list(range(2 * n - 1, 3 * n))))
    assert str(2 * n - 1) in str(ei.value)
    txn.delete("db", "t", [n, n + 1])
    txn.insert("db", "t", [{"id": n, "v": "again"}])
    other = e.begin()
    other.insert("db", "t", batch(list(range(2 * n - 1, 3 * n))))
    txn.commit().result(timeout=10)
    with pytest.raises(ConflictError):
        other.commit().result(timeout=10)
    got = rows(e)
    assert [r["id"] for r in got] == [i for i in range(2 * n) if i != n + 1]
    assert got[n]["v"] == "again" and got[n - 1]["v"] == f"v{n - 1}"
    assert rows(Engine.recover(log)) == got
