"""Shared helpers for the checkpoint tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from infra.objectstore import ObjectStore
from tn.checkpoint.recovery import Recovered, recover
from tn.engine import Engine
from tn.logstore.driver import LogStore
from tn.logstore.file_backend import FileDriver
from tn.memtable.block import DroppedCols


def open_log(wal_dir: Path) -> LogStore:
    return LogStore(FileDriver(wal_dir))


def restart(wal_dir: Path, store: ObjectStore) -> Recovered:
    return recover(open_log(wal_dir), store)


def shutdown(engine: Engine) -> None:
    engine.close()
    engine.log.close()


def create(engine: Engine, db: str = "db", table: str = "t") -> int:
    txn = engine.begin()
    if db not in engine.tables():
        txn.create_database(db)
    txn.create_table(db, table, [("id", "int64"), ("v", "string"), ("x", "float64")], "id")
    return txn.commit().result(timeout=10)


def insert(engine: Engine, lo: int, hi: int, db: str = "db", table: str = "t") -> int:
    txn = engine.begin()
    txn.insert(db, table, [{"id": i, "v": f"v{i}", "x": i / 2} for i in range(lo, hi)])
    return txn.commit().result(timeout=30)


def delete(engine: Engine, keys: list[int], db: str = "db", table: str = "t") -> int:
    txn = engine.begin()
    txn.delete(db, table, keys)
    return txn.commit().result(timeout=30)


def update(engine: Engine, keys: list[int], tag: str, db: str = "db", table: str = "t") -> int:
    txn = engine.begin()
    txn.update(db, table, [{"id": k, "v": f"{tag}{k}", "x": None} for k in keys])
    return txn.commit().result(timeout=30)


def reads(engine: Engine, tss: list[int], db: str = "db", table: str = "t") -> list[Any]:
    out = []
    for ts in tss:
        try:
            out.append(engine.read(db, table, ts).to_pylist())
        except Exception as e:  # e.g. the table did not exist yet
            out.append(type(e).__name__)
    return out


def memory_rows(engine: Engine) -> int:
    """Rows whose columns are held in the memtable (not dropped after a checkpoint)."""
    n = 0
    for node in list(engine.catalog.nodes.values()):
        mem = getattr(node, "mem", None)
        if mem is None or not hasattr(mem, "cts"):
            continue
        if not isinstance(mem.cols, DroppedCols):
            n += len(mem)
    return n


def table_eq(a: pa.Table, b: pa.Table) -> bool:
    return a.to_pylist() == b.to_pylist()
