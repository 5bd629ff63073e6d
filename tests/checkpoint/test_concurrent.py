"""Checkpoints taken while transactions commit concurrently: nothing lost or duplicated."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from infra.objectstore import FolderStore
from tests.checkpoint.helpers import (
    create,
    insert,
    memory_rows,
    open_log,
    reads,
    restart,
    shutdown,
)
from tn.checkpoint.manifest import Manifest
from tn.checkpoint.runner import CheckpointRunner
from tn.engine import Engine
from tn.exceptions import ConflictError
from tn.memtable.block import BLOCK_ROWS


def test_checkpoints_during_concurrent_commits(tmp_path: Path):
    store = FolderStore(tmp_path / "objects")
    wal = tmp_path / "wal"
    eng = Engine(open_log(wal))
    runner = CheckpointRunner(eng, store)
    create(eng)
    stop = threading.Event()
    commits: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        rng = random.Random(w)
        k = w * 1_000_000
        try:
            while not stop.is_set():
                txn = eng.begin()
                txn.insert("db", "t", [{"id": k + i, "v": f"{w}", "x": 1.0} for i in range(200)])
                if k > w * 1_000_000:
                    old = [rng.randrange(w * 1_000_000, k) for _ in range(5)]
                    txn.update("db", "t", [{"id": o, "v": "u", "x": 2.0} for o in set(old)])
                k += 200
                try:
                    ts = txn.commit().result(timeout=30)
                except ConflictError:
                    continue
                with lock:
                    commits.append(ts)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    manifests: list[Manifest] = []
    try:
        while len(manifests) < 4:
            while len(commits) < 25 * (len(manifests) + 1) and not errors:
                stop.wait(0.01)
            m = runner.checkpoint()
            if m is not None:
                manifests.append(m)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors
    assert len(commits) >= 100
    assert [m.lsn for m in manifests] == sorted(m.lsn for m in manifests)
    sample = sorted(commits)[:: max(1, len(commits) // 15)] + [eng.visible_ts]
    expected = reads(eng, sample)
    assert len(expected[-1]) >= 100 * 200
    assert memory_rows(eng) < sum(len(r) for r in expected[-1:]) + 3 * 8192
    shutdown(eng)
    rec = restart(wal, store)
    assert reads(rec.engine, sample) == expected
    shutdown(rec.engine)


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_checkpoint_keeps_the_rows_a_running_transaction_holds_in_a_full_block(
    tmp_path: Path, outcome: str
):
    """A transaction's rows sit in the memtable before it commits (commit ts MAX_TS). A
    checkpoint that finds them filling a block must not take the block for complete:
    dropping it from memory lost those rows once they committed, and their WAL entry
    went with the next truncation (CI run u10: a restart met a delete of a row with
    no key). Rolled back instead, they are placeholders the next checkpoint leaves out."""
    store = FolderStore(tmp_path / "objects")
    wal = tmp_path / "wal"
    eng = Engine(open_log(wal))
    runner = CheckpointRunner(eng, store)
    create(eng)
    insert(eng, 0, BLOCK_ROWS - 5)
    running = eng.begin()
    late = range(BLOCK_ROWS - 5, BLOCK_ROWS)
    running.insert("db", "t", [{"id": i, "v": "late", "x": 0.0} for i in late])
    assert runner.checkpoint() is not None
    if outcome == "commit":
        ts = running.commit().result(timeout=10)
    else:
        running.rollback()
        ts = eng.heartbeat().result(timeout=10)
    assert runner.checkpoint() is not None
    assert memory_rows(eng) == 0  # the block was dumped whole, then dropped
    expected = reads(eng, [ts])
    kept = set(late) if outcome == "commit" else set()
    assert len(expected[0]) == BLOCK_ROWS - 5 + len(kept)
    assert {r["id"] for r in expected[0] if r["v"] == "late"} == kept
    shutdown(eng)
    rec = restart(wal, store)
    assert reads(rec.engine, [ts]) == expected
    shutdown(rec.engine)
