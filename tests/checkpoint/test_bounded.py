"""Sustained load: the WAL since the last checkpoint and the memtable stay bounded."""

from __future__ import annotations

import random
import time
from pathlib import Path

from infra.objectstore import FolderStore
from tests.checkpoint.helpers import create, insert, memory_rows, open_log, reads, restart, shutdown
from tn.checkpoint.runner import CheckpointRunner
from tn.engine import Engine
from tn.memtable.block import BLOCK_ROWS

BATCH = 1000
PER_CHECKPOINT = 10  # transactions between checkpoints


def test_wal_and_memory_bounded_while_data_grows(tmp_path: Path):
    store = FolderStore(tmp_path / "objects")
    wal = tmp_path / "wal"
    eng = Engine(open_log(wal))
    runner = CheckpointRunner(eng, store, wal_entries=PER_CHECKPOINT, interval_s=3600)
    create(eng)
    rng = random.Random(7)
    total = 0
    max_mem = 0
    max_wal = 0
    truncations = []
    for i in range(120):  # 120k rows, ~15 blocks
        insert(eng, total, total + BATCH)
        total += BATCH
        if i % 3 == 0:  # deletes and updates hit old (flushed, dropped) blocks too
            txn = eng.begin()
            txn.delete("db", "t", [rng.randrange(total) for _ in range(20)])
            txn.commit().result(timeout=30)
        if runner.due(time.monotonic()):
            assert runner.checkpoint() is not None
            truncations.append(eng.log.truncated())
        max_mem = max(max_mem, memory_rows(eng))
        max_wal = max(max_wal, eng.log.next_lsn() - 1 - eng.log.truncated())
    assert total == 120 * BATCH
    # bounded: the open block + the blocks filled since the last checkpoint
    mem_bound = 2 * BLOCK_ROWS + PER_CHECKPOINT * BATCH
    assert max_mem <= mem_bound, (max_mem, mem_bound)
    assert max_wal <= 2 * PER_CHECKPOINT + 4, max_wal
    assert truncations == sorted(truncations) and len(set(truncations)) == len(truncations)
    latest = eng.read("db", "t")
    assert latest.num_rows > total - 120 * 20
    ts = eng.visible_ts
    shutdown(eng)
    rec = restart(wal, store)
    assert rec.replayed <= 2 * PER_CHECKPOINT + 4  # bounded by the WAL since the checkpoint
    assert memory_rows(rec.engine) <= mem_bound
    assert reads(rec.engine, [ts]) == [latest.to_pylist()]
    shutdown(rec.engine)


def test_background_task_checkpoints(tmp_path: Path):
    store = FolderStore(tmp_path / "objects")
    eng = Engine(open_log(tmp_path / "wal"))
    runner = CheckpointRunner(eng, store, interval_s=0.2).start(poll_s=0.05)
    try:
        create(eng)
        insert(eng, 0, 100)
        deadline = time.monotonic() + 20
        while eng.log.truncated() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert eng.log.truncated() >= 2
        assert not runner.errors
    finally:
        runner.stop()
        shutdown(eng)
