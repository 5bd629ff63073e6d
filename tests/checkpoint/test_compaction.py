"""Compaction, merge and large transactions: metadata-only WAL entries."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from infra.objectstore import FolderStore, ObjectStore
from schemas.codec import decode_entry
from schemas.wal import Append, CatalogReason, UpdateCatalog
from tests.checkpoint.helpers import create, delete, insert, open_log, reads, restart, shutdown
from tn.catalog.nodes import BlockNode
from tn.checkpoint.compaction import attach_object, compact_block, merge_segment
from tn.checkpoint.dump import to_parquet
from tn.checkpoint.exceptions import LargeTxnError
from tn.checkpoint.runner import CheckpointRunner
from tn.engine import Engine
from tn.exceptions import ConflictError
from tn.memtable.block import BLOCK_ROWS, DroppedCols


@pytest.fixture(params=["folder", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "s3":
        s: ObjectStore = request.getfixturevalue("s3_store")
        return s
    return FolderStore(tmp_path / "objects")


def _shuffled_load(eng: Engine, n: int, seed: int = 3) -> list[int]:
    keys = list(range(n))
    random.Random(seed).shuffle(keys)
    ts = []
    for i in range(0, n, 3000):
        txn = eng.begin()
        txn.insert("db", "t", [{"id": k, "v": f"v{k}", "x": float(k)} for k in keys[i : i + 3000]])
        ts.append(txn.commit().result(timeout=30))
    return ts


def _full_blocks(eng: Engine) -> list[BlockNode]:
    t = eng.catalog.table(eng.catalog.database("db", eng.visible_ts), "t", eng.visible_ts)  # type: ignore[arg-type]
    assert t is not None
    return [b for b in t.mem.blocks if len(b.mem) == BLOCK_ROWS and b.delete_ts > eng.visible_ts]


def test_compact_and_merge_keep_old_reads(tmp_path: Path, store: ObjectStore):
    wal = tmp_path / "wal"
    eng = Engine(open_log(wal))
    runner = CheckpointRunner(eng, store)
    ts = [create(eng)]
    ts += _shuffled_load(eng, 3 * BLOCK_ROWS + 500)
    ts.append(delete(eng, [5, 6, 7, 9000]))
    runner.checkpoint()
    ts.append(delete(eng, [8]))
    runner.checkpoint()  # the delete of key 8 is in a delta object
    before = reads(eng, ts)
    lsn0 = eng.log.next_lsn()
    blocks = _full_blocks(eng)
    assert len(blocks) == 3
    c1 = compact_block(eng, store, "db", "t", blocks[0].id)
    ts.append(c1)
    # only metadata in the WAL
    entry = decode_entry(next(iter(eng.log.records(lsn0))).payload)
    assert entry.commands and all(isinstance(c, UpdateCatalog) for c in entry.commands)
    assert {c.reason for c in entry.commands if isinstance(c, UpdateCatalog)} == {
        CatalogReason.COMPACT
    }
    assert not any(isinstance(c, Append) for c in entry.commands)
    assert reads(eng, ts[:-1]) == before
    new = [b for b in _full_blocks(eng) if b.create_ts == c1]
    assert len(new) == 1
    dropped = new[0].mem.cols
    assert isinstance(dropped, DroppedCols) and eng.block_columns is not None
    keys = eng.block_columns(dropped.loc, BLOCK_ROWS)
    pk = [k for k in keys[1].to_pylist() if k is not None]
    assert pk == sorted(pk)
    seg = blocks[1].segment
    m = merge_segment(eng, store, "db", "t", seg.id)
    ts.append(m)
    after = reads(eng, ts)
    assert after[: len(before)] == before
    assert after[-1] == after[-2] == before[-1]
    # writes after the merge; restart with and without a checkpoint after it
    ts.append(delete(eng, [100, 101]))
    ts.append(insert(eng, 900_000, 900_010))
    expected = reads(eng, ts)
    shutdown(eng)
    rec = restart(wal, store)  # replays compaction + merge entries from the WAL
    assert reads(rec.engine, ts) == expected
    rec.runner().checkpoint()
    shutdown(rec.engine)
    rec2 = restart(wal, store)  # everything from the checkpoint
    assert rec2.replayed <= 1
    assert reads(rec2.engine, ts) == expected
    shutdown(rec2.engine)


def test_compaction_conflicts_with_concurrent_delete(tmp_path: Path):
    store = FolderStore(tmp_path / "objects")
    eng = Engine(open_log(tmp_path / "wal"))
    runner = CheckpointRunner(eng, store)
    create(eng)
    insert(eng, 0, BLOCK_ROWS + 1)
    runner.checkpoint()
    blk = _full_blocks(eng)[0]
    old = eng.begin()  # starts before the compaction, deletes after it
    compact_block(eng, store, "db", "t", blk.id)
    old.delete("db", "t", [3])
    with pytest.raises(ConflictError):
        old.commit().result()
    delete(eng, [3])  # a fresh transaction deletes from the new block
    assert 3 not in eng.read("db", "t").column("id").to_pylist()
    shutdown(eng)


def test_large_transaction(tmp_path: Path, store: ObjectStore):
    wal = tmp_path / "wal"
    eng = Engine(open_log(wal))
    CheckpointRunner(eng, store)
    ts = [create(eng)]
    ts.append(insert(eng, 0, 10))
    n = BLOCK_ROWS + 20
    big = pa.table(
        {"id": pa.array(range(1000, 1000 + n), pa.int64()), "v": [f"b{i}" for i in range(n)]}
    )
    store.put("uploads/big.parquet", to_parquet(big))
    lsn0 = eng.log.next_lsn()
    ts.append(attach_object(eng, store, "db", "t", "uploads/big.parquet"))
    entry = decode_entry(next(iter(eng.log.records(lsn0))).payload)
    assert all(isinstance(c, UpdateCatalog) for c in entry.commands)
    assert len(eng.log.records(lsn0).__next__().payload) < 2000  # metadata only
    got = eng.read("db", "t")
    assert got.num_rows == 10 + n
    assert eng.read("db", "t", ts[1]).num_rows == 10
    # validation
    with pytest.raises(LargeTxnError, match="does not exist"):
        attach_object(eng, store, "db", "t", "uploads/none.parquet")
    store.put(
        "uploads/dup.parquet", to_parquet(pa.table({"id": pa.array([5, 2000_000], pa.int64())}))
    )
    with pytest.raises(LargeTxnError) as e:
        attach_object(eng, store, "db", "t", "uploads/dup.parquet")
    assert e.value.code == "duplicate_key"
    store.put("uploads/bad.parquet", to_parquet(pa.table({"id": pa.array([1]), "zz": [1]})))
    with pytest.raises(LargeTxnError) as e:
        attach_object(eng, store, "db", "t", "uploads/bad.parquet")
    assert e.value.code == "schema_mismatch"
    store.put("uploads/bad2.parquet", to_parquet(pa.table({"id": ["x"]})))
    with pytest.raises(LargeTxnError) as e:
        attach_object(eng, store, "db", "t", "uploads/bad2.parquet")
    assert e.value.code == "schema_mismatch"
    # the attached rows behave like others: delete, update, conflict on insert
    ts.append(delete(eng, [1000, 1001]))
    txn = eng.begin()
    with pytest.raises(Exception, match="duplicate"):
        txn.insert("db", "t", [{"id": 1002, "v": "again"}])
    txn.rollback()
    expected = reads(eng, ts)
    shutdown(eng)
    rec = restart(wal, store)
    assert reads(rec.engine, ts) == expected
    rec.runner().checkpoint()
    shutdown(rec.engine)
    rec2 = restart(wal, store)
    assert reads(rec2.engine, ts) == expected
    shutdown(rec2.engine)
