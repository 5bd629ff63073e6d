"""`kwal checkpoint now/list` and the CN reading the checkpoint's objects."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from consumers.core.block_cache import BlockCache
from consumers.core.table_state import TableState
from infra.config import KwalConfig, ObjectStoreConfig, WalConfig
from infra.objectstore import FolderStore
from schemas.logtail import BlockMeta, Checkpoint, LogtailRecord
from tests.checkpoint.helpers import create, delete, insert, open_log, shutdown, update
from tn.checkpoint.commands import run_list, run_now
from tn.checkpoint.runner import CheckpointRunner
from tn.engine import Engine
from tn.memtable.block import BLOCK_ROWS


def _cfg(tmp_path: Path) -> KwalConfig:
    return KwalConfig(
        objectstore=ObjectStoreConfig(url=f"file://{tmp_path / 'objects'}"),
        wal=WalConfig(backend="file", dir=str(tmp_path / "wal")),
    )


def test_checkpoint_now_and_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    cfg = _cfg(tmp_path)
    eng = Engine(open_log(Path(cfg.wal.dir)))
    create(eng)
    insert(eng, 0, 500)
    delete(eng, [1])
    shutdown(eng)
    assert run_now(Namespace(json=True), cfg) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["checkpoint"]["lsn"] == 3 and out["replayed"] == 3
    assert out["checkpoint"]["objects"] == 2  # a block and its delta
    assert run_now(Namespace(json=True), cfg) == 0  # the FLUSH entry only: covered again
    second = json.loads(capsys.readouterr().out)
    assert second["replayed"] == 1
    assert run_list(Namespace(json=True), cfg) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["lsn"] for r in rows][0] == 3 and len(rows) >= 1
    assert rows[0]["bytes"] > 0
    assert run_list(Namespace(json=False), cfg) == 0
    text = capsys.readouterr().out
    assert "lsn" in text and str(rows[0]["ts"]) in text


def test_cn_reads_checkpoint_objects(tmp_path: Path):
    """The objects match the layout consumers/core/table_state.py reads."""
    store = FolderStore(tmp_path / "objects")
    eng = Engine(open_log(tmp_path / "wal"))
    published: list[LogtailRecord] = []
    runner = CheckpointRunner(eng, store, publish=published.extend)
    create(eng)
    insert(eng, 0, BLOCK_ROWS + 50)
    delete(eng, [3, BLOCK_ROWS + 2])
    update(eng, [4], "u")
    m = runner.checkpoint()
    assert m is not None
    metas = [r.body for r in published if isinstance(r.body, BlockMeta)]
    assert len(metas) == 2
    assert [r.body for r in published if isinstance(r.body, Checkpoint)] == [Checkpoint(m.key)]
    t = eng.catalog.table(eng.catalog.database("db", m.ts), "t", m.ts)  # type: ignore[arg-type]
    assert t is not None
    state = TableState("db", "t", t.id, schemas=list(t.schemas), create_ts=t.create_ts)
    for meta in metas:
        assert isinstance(meta, BlockMeta)
        state.apply_block_meta(meta)
    for ts in (m.ts, t.create_ts + 1):
        assert state.snapshot(ts, BlockCache(store.get)).to_pylist() == eng.read("db", "t", ts).to_pylist()
    shutdown(eng)


def test_cn_follows_compaction_and_large_transaction(tmp_path: Path):
    import pyarrow as pa

    from tn.checkpoint.compaction import attach_object, compact_block
    from tn.checkpoint.dump import to_parquet

    store = FolderStore(tmp_path / "objects")
    eng = Engine(open_log(tmp_path / "wal"))
    published: list[LogtailRecord] = []
    runner = CheckpointRunner(eng, store, publish=published.extend)
    ts = [create(eng), insert(eng, 0, BLOCK_ROWS + 5)]
    ts.append(delete(eng, [2]))
    runner.checkpoint()
    t = eng.catalog.table(eng.catalog.database("db", ts[-1]), "t", ts[-1])  # type: ignore[arg-type]
    assert t is not None
    full = t.mem.blocks[0]
    ts.append(compact_block(eng, store, "db", "t", full.id, publish=published.extend))
    big = pa.table({"id": pa.array(range(10**6, 10**6 + 300), pa.int64())})
    store.put("up/big.parquet", to_parquet(big))
    ts.append(attach_object(eng, store, "db", "t", "up/big.parquet", publish=published.extend))
    ts.append(delete(eng, [3, 10**6 + 1]))  # rows of the compacted and the attached block
    runner.checkpoint()
    state = TableState("db", "t", t.id, schemas=list(t.schemas), create_ts=t.create_ts)
    for rec in published:
        if isinstance(rec.body, BlockMeta):
            state.apply_block_meta(rec.body)
    for at in ts[1:]:
        assert state.snapshot(at, BlockCache(store.get)).to_pylist() == eng.read("db", "t", at).to_pylist()
    shutdown(eng)
