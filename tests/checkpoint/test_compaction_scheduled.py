"""Scheduled compaction (issue 30, item 5): the policy, and the TN running it by itself.

In process (an engine on a file WAL): the policy's two thresholds, each just below and
at its trigger; the result is metadata-only in the WAL, reads at every earlier ts are
unchanged, replay (from the WAL, then from a checkpoint) gives the same state, and the
checkpoint lists fewer objects. On a real TN process (Kafka WAL): the TN compacts by
itself under a small-block workload while a CN follows it, and `kwal ops compact`
runs the policy now on a TN that never runs it by itself."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from consumers.core.cn import CN
from infra.config import CompactionConfig, ConfigError, KwalConfig
from infra.objectstore import FolderStore, open_store
from infra.processes import free_port
from infra.topics import ensure_topics
from ops.cli import build_parser
from ops.compact import run as ops_compact
from producers import Client
from schemas.codec import decode_entry
from schemas.wal import Append, CatalogReason, UpdateCatalog
from tests.checkpoint.helpers import create, delete, insert, open_log, reads, restart, shutdown
from tests.ops.scrape import scrape, value
from tests.service.harness import recover_engine
from tests.waiting import wait_until
from tn.checkpoint.manifest import Manifest, newest_manifest
from tn.checkpoint.policy import CompactionPolicy
from tn.checkpoint.runner import CheckpointRunner
from tn.checkpoint.scheduler import CompactionScheduler
from tn.engine import Engine
from tn.memtable.block import BLOCK_ROWS
from tn.service.process import TnProcess

KEEP = 50  # live rows left in a block made small


def data_objects(m: Manifest, table_id: int) -> list[str]:
    """The table's data and delta objects (not the key filters beside them)."""
    return sorted(
        k for k in m.objects if k.startswith(f"data/{table_id}/") and not k.endswith(".pk")
    )


def table_id(eng: Engine) -> int:
    t = eng.catalog.table(eng.catalog.database("db", eng.visible_ts), "t", eng.visible_ts)  # type: ignore[arg-type]
    assert t is not None
    return t.id


def thin(eng: Engine, block: int) -> int:
    """Delete all but KEEP rows of block `block` (keys block*BLOCK_ROWS ... in order)."""
    lo = block * BLOCK_ROWS
    return delete(eng, list(range(lo + KEEP, lo + BLOCK_ROWS)))


def test_small_blocks_merge_once_their_count_reaches_the_threshold(tmp_path: Path) -> None:
    store = FolderStore(tmp_path / "objects")
    wal = tmp_path / "wal"
    eng = Engine(open_log(wal))
    runner = CheckpointRunner(eng, store)
    policy = CompactionPolicy(small_rows=KEEP, min_small_blocks=3, tombstone_ratio=1.0)
    scheduler = CompactionScheduler(eng, store, policy, exclusive=runner.exclusive)
    ts = [create(eng)]
    ts += [insert(eng, b * BLOCK_ROWS, (b + 1) * BLOCK_ROWS) for b in range(4)]
    runner.checkpoint()  # four full blocks flushed, their columns dropped from memory
    ts += [thin(eng, 0), thin(eng, 1)]
    assert scheduler.run_once() == []  # two small blocks: below min_small_blocks
    ts.append(thin(eng, 2))
    before = reads(eng, ts)
    first = runner.checkpoint()
    assert first is not None
    lsn0 = eng.log.next_lsn()
    done = scheduler.run_once()
    assert [(c.table, len(c.blocks), c.live_rows, c.error) for c in done] == [
        ("db.t", 3, 3 * KEEP, "")
    ]
    ts.append(done[0].commit_ts)
    entries = [decode_entry(r.payload) for r in eng.log.records(lsn0)]
    assert len(entries) == 1  # the merge: catalog updates only (seed 004)
    commands = entries[0].commands
    assert commands and not any(isinstance(c, Append) for c in commands)
    assert {c.reason for c in commands if isinstance(c, UpdateCatalog)} == {CatalogReason.MERGE}
    assert reads(eng, ts)[:-1] == before and reads(eng, ts)[-1] == before[-1]
    assert scheduler.run_once() == []  # its output triggers nothing
    second = runner.checkpoint()
    assert second is not None
    tid = table_id(eng)
    # three blocks' data and delta objects (6) became the merged block's data object: what
    # is left is it and block 3's
    assert len(data_objects(first, tid)) == 4 + 3 and len(data_objects(second, tid)) == 1 + 1
    expected = reads(eng, ts)
    shutdown(eng)
    rec = restart(wal, store)  # the catalog from the checkpoint: nothing to replay
    assert reads(rec.engine, ts[-1:]) == expected[-1:]
    shutdown(rec.engine)


def test_a_tombstoned_block_is_rewritten_alone_and_replays(tmp_path: Path) -> None:
    store = FolderStore(tmp_path / "objects")
    wal = tmp_path / "wal"
    eng = Engine(open_log(wal))
    runner = CheckpointRunner(eng, store)
    policy = CompactionPolicy(small_rows=0, min_small_blocks=4, tombstone_ratio=0.5)
    scheduler = CompactionScheduler(eng, store, policy, exclusive=runner.exclusive)
    ts = [create(eng), insert(eng, 0, 2 * BLOCK_ROWS)]
    runner.checkpoint()
    half = BLOCK_ROWS // 2
    ts.append(delete(eng, list(range(half - 1))))  # just below half of block 0
    assert scheduler.run_once() == []
    ts.append(delete(eng, [half - 1]))  # exactly half: the ratio is reached
    done = scheduler.run_once()
    assert [(len(c.blocks), c.live_rows) for c in done] == [(1, BLOCK_ROWS - half)]
    ts.append(done[0].commit_ts)
    ts.append(delete(eng, [half, BLOCK_ROWS + 1]))  # deletes land in the new block, and block 1
    expected = reads(eng, ts)
    shutdown(eng)
    rec = restart(wal, store)  # no checkpoint since: the compaction replays from the WAL
    assert rec.replayed >= 3
    assert reads(rec.engine, ts) == expected
    shutdown(rec.engine)


# ---- a real TN ------------------------------------------------------------------------------


def tn_config(cfg: KwalConfig, interval_s: float) -> KwalConfig:
    cfg.tn.heartbeat_ms = 50
    cfg.tn.checkpoint_interval_s = 0.5
    cfg.compaction.interval_s = interval_s
    cfg.compaction.small_rows = KEEP
    cfg.compaction.min_small_blocks = 2
    return cfg


def load_two_thinned_blocks(client: Client, cfg: KwalConfig) -> tuple[int, int]:
    """Two full blocks, a checkpoint that flushes them, then all but KEEP rows of each
    deleted. Returns (the inserts' ts, the deletes' ts)."""
    t = client.begin()
    t.create_database("db")
    t.create_table("db.t", [("id", "int64"), ("v", "string")], "id")
    t.commit(timeout=60)
    for b in range(2):
        t = client.begin()
        t.insert("db.t", [{"id": k, "v": f"v{k}"} for k in range(b * BLOCK_ROWS, (b + 1) * BLOCK_ROWS)])
        inserted = t.commit(timeout=60).commit_ts
    store = open_store(cfg.objectstore)
    wait_until("a checkpoint", lambda: (m := newest_manifest(store)) is not None and m.ts >= inserted)
    t = client.begin()
    t.delete("db.t", [k for k in range(2 * BLOCK_ROWS) if k % BLOCK_ROWS >= KEEP])
    return inserted, t.commit(timeout=60).commit_ts


def expected_rows() -> list[dict[str, object]]:
    keys = [k for k in range(2 * BLOCK_ROWS) if k % BLOCK_ROWS < KEEP]
    return [{"id": k, "v": f"v{k}"} for k in keys]


def test_the_tn_compacts_by_itself_and_a_cn_follows(kwal_config: KwalConfig, tmp_path: Path) -> None:
    cfg = tn_config(kwal_config, interval_s=0.2)
    cfg.tn.metrics_port = free_port()
    ensure_topics(cfg)
    tn = TnProcess(cfg, tmp_path)
    tn.start()
    store = open_store(cfg.objectstore)
    cn = CN(cfg, ["db.t"], store, bootstrap=False).start()
    try:
        with Client(cfg, "small-blocks") as client:
            inserted, deleted = load_two_thinned_blocks(client, cfg)

            def merged() -> bool:
                m = newest_manifest(store)
                if m is None or m.ts <= deleted:
                    return False
                tid = next(s.table_id for s in cn.tables.get("db.t", []))
                return len(data_objects(m, tid)) == 1
            wait_until("the TN to merge the two small blocks and checkpoint", merged)
            metrics = scrape(cfg.tn.metrics_port)  # the counters an operator sees moved
            assert value(metrics, "kwal_compactions_total") == 1
            assert value(metrics, "kwal_compacted_blocks_total") == 2
            t = client.begin()
            t.insert("db.t", [{"id": 10**6, "v": "after"}])
            last = t.commit(timeout=60).commit_ts
        assert cn.wait_for(last, "db.t", timeout_s=60)
        after = [*expected_rows(), {"id": 10**6, "v": "after"}]
        assert cn.snapshot("db.t", last).to_pylist() == after
        assert cn.snapshot("db.t", deleted).to_pylist() == expected_rows()
        assert cn.snapshot("db.t", inserted).num_rows == 2 * BLOCK_ROWS
        state = cn.tables["db.t"][0]
        assert sum(1 for b in state.blocks.values() if b.meta.delete_ts) == 2  # it followed
    finally:
        cn.close()
    assert tn.terminate() == 0
    engine, log = recover_engine(cfg)  # the checkpoint after the merge, then the WAL
    try:
        assert engine.read("db", "t").to_pylist() == after
        assert engine.read("db", "t", deleted).to_pylist() == expected_rows()
    finally:
        engine.close()
        log.close()


def test_kwal_ops_compact_runs_the_policy_now(
    kwal_config: KwalConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tn_config(kwal_config, interval_s=0)  # the TN never compacts by itself
    ensure_topics(cfg)
    tn = TnProcess(cfg, tmp_path)
    tn.start()
    try:
        with Client(cfg, "small-blocks") as client:
            _, deleted = load_two_thinned_blocks(client, cfg)
        args = build_parser().parse_args(["ops", "compact", "--table", "db.t", "--json"])
        assert args.target == "ops.compact:run"
        args.timeout = 60.0
        assert ops_compact(args, cfg) == 0
        done = json.loads(capsys.readouterr().out)["compacted"]
        assert [(len(c["blocks"]), c["live_rows"], c["error"]) for c in done] == [(2, 2 * KEEP, "")]
        assert done[0]["commit_ts"] > deleted
        assert ops_compact(args, cfg) == 0  # again: nothing left to do
        assert json.loads(capsys.readouterr().out) == {"compacted": []}
        assert ops_compact(SimpleNamespace(table="db.nope", json=True, timeout=60.0), cfg) == 1
        assert "unknown table 'db.nope'" in capsys.readouterr().err
    finally:
        assert tn.terminate() == 0
    engine, log = recover_engine(cfg)
    try:
        assert engine.read("db", "t").to_pylist() == expected_rows()
    finally:
        engine.close()
        log.close()


def test_a_policy_that_could_loop_or_never_trigger_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="min_small_blocks must be at least 2"):
        CompactionPolicy(min_small_blocks=1)
    with pytest.raises(ConfigError, match="tombstone_ratio must be in"):
        CompactionPolicy.from_config(CompactionConfig(tombstone_ratio=0.0))
    cfg = KwalConfig.load(environ={"KWAL_COMPACTION_MIN_SMALL_BLOCKS": "7"})
    assert CompactionPolicy.from_config(cfg.compaction).min_small_blocks == 7
