"""Checkpoints to object storage, WAL truncation and recovery from checkpoint + WAL."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from infra.objectstore import FolderStore, ObjectStore
from tests.checkpoint.helpers import (
    create,
    delete,
    insert,
    memory_rows,
    open_log,
    reads,
    restart,
    shutdown,
    update,
)
from tn.checkpoint.exceptions import CheckpointError, InjectedCrash
from tn.checkpoint.manifest import list_manifests
from tn.checkpoint.recovery import Recovered, recover
from tn.checkpoint.runner import STEPS, CheckpointRunner
from tn.engine import Engine
from tn.memtable.block import BLOCK_ROWS


@pytest.fixture(params=["folder", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "s3":
        s: ObjectStore = request.getfixturevalue("s3_store")
        return s
    return FolderStore(tmp_path / "objects")


def test_before_and_after_checkpoint_readable_after_restart(tmp_path: Path, store: ObjectStore):
    wal = tmp_path / "wal"
    eng = Engine(open_log(wal))
    runner = CheckpointRunner(eng, store)
    ts = [create(eng)]
    ts.append(insert(eng, 0, BLOCK_ROWS + 100))  # one full block + an open one
    ts.append(delete(eng, [1, 2, BLOCK_ROWS + 5]))
    m1 = runner.checkpoint()
    assert m1 is not None and m1.lsn >= 3
    assert eng.log.truncated() == m1.lsn
    assert memory_rows(eng) < BLOCK_ROWS + 200  # the full block was dropped from memory
    ts.append(update(eng, [3, BLOCK_ROWS + 6], "u"))  # after the checkpoint: in the WAL only
    ts.append(insert(eng, BLOCK_ROWS + 100, BLOCK_ROWS + 150))
    before = reads(eng, ts)
    assert len(before[-1]) == BLOCK_ROWS + 150 - 3
    shutdown(eng)

    rec = restart(wal, store)
    assert rec.manifest is not None and rec.manifest.ts == m1.ts
    assert rec.replayed == 3  # the FLUSH entry + 2 transactions after the checkpoint
    assert reads(rec.engine, ts) == before
    # keeps working: new writes, a second checkpoint, another restart
    runner2 = rec.runner()
    ts.append(insert(rec.engine, 50_000, 50_010))
    m2 = runner2.checkpoint()
    assert m2 is not None and m2.ts > m1.ts and m2.lsn > m1.lsn
    assert rec.engine.log.truncated() == m2.lsn > m1.lsn  # the truncation point moves
    before = reads(rec.engine, ts)
    shutdown(rec.engine)
    rec2 = restart(wal, store)
    assert rec2.replayed == 1  # only the second checkpoint's FLUSH entry
    assert reads(rec2.engine, ts) == before
    assert [m.ts for m in list_manifests(store)] == [m1.ts, m2.ts]
    shutdown(rec2.engine)


def _workload(eng: Engine) -> list[int]:
    ts = [create(eng)]
    ts.append(insert(eng, 0, BLOCK_ROWS + 10))
    ts.append(delete(eng, [0, 7]))
    return ts


@pytest.mark.parametrize("step", STEPS)
def test_crash_between_steps_recovers_same_state(tmp_path: Path, step: str, store: ObjectStore):
    wal = tmp_path / "wal"
    eng = Engine(open_log(wal))
    CheckpointRunner(eng, store).checkpoint()  # an earlier complete checkpoint (empty)
    ts = _workload(eng)
    first = CheckpointRunner(eng, store)
    assert first.checkpoint() is not None
    ts += [insert(eng, 100_000, 100_005), update(eng, [5, BLOCK_ROWS + 1], "w")]

    def crash(at: str) -> None:
        if at == step:
            raise InjectedCrash(at)

    rec0 = restart_from(eng, wal, store)
    runner = rec0.runner(hook=crash)
    ts.append(delete(rec0.engine, [9]))
    expected = reads(rec0.engine, ts)
    with pytest.raises(InjectedCrash):
        runner.checkpoint()
    assert reads(rec0.engine, ts) == expected
    shutdown(rec0.engine)
    rec = restart(wal, store)
    assert reads(rec.engine, ts) == expected
    # redo: the next checkpoint completes and recovers to the same state again
    m = rec.runner().checkpoint()
    assert m is not None
    ts.append(insert(rec.engine, 200_000, 200_003))
    expected = reads(rec.engine, ts)
    shutdown(rec.engine)
    rec2 = restart(wal, store)
    assert reads(rec2.engine, ts) == expected
    assert rec2.engine.log.truncated() == m.lsn
    shutdown(rec2.engine)


def restart_from(eng: Engine, wal: Path, store: ObjectStore) -> Recovered:
    shutdown(eng)
    return recover(open_log(wal), store)


def test_plain_replay_refuses_a_truncated_wal(tmp_path: Path):
    store = FolderStore(tmp_path / "objects")
    eng = Engine(open_log(tmp_path / "wal"))
    runner = CheckpointRunner(eng, store)
    create(eng)
    insert(eng, 0, 10)
    runner.checkpoint()
    shutdown(eng)
    log = open_log(tmp_path / "wal")
    with pytest.raises(ValueError, match="truncated"):
        Engine.recover(log)
    log.close()


def test_recovery_refuses_another_wals_checkpoint(tmp_path: Path) -> None:
    """One object store, two WALs: the second WAL's TN must not load the first one's tables
    (a shared default store once made a TN resume another WAL's state silently)."""
    store = FolderStore(tmp_path / "objects")
    eng = Engine(open_log(tmp_path / "wal-a"))
    create(eng)
    insert(eng, 0, 10)
    m = CheckpointRunner(eng, store).checkpoint()
    assert m is not None and m.wal == f"file:{(tmp_path / 'wal-a').resolve()}"
    shutdown(eng)
    log = open_log(tmp_path / "wal-b")
    with pytest.raises(CheckpointError, match="wal-a.*not of this WAL.*wal-b"):
        recover(log, store)
    log.close()
    # a manifest that names no WAL (written before manifests did): the LSN still tells
    store.put(m.key, dataclasses.replace(m, wal="").encode())
    log = open_log(tmp_path / "wal-c")
    with pytest.raises(CheckpointError, match=f"through LSN {m.lsn}, but this WAL ends at LSN 0"):
        recover(log, store)
    log.close()
    # its own WAL still recovers from that checkpoint
    rec = restart(tmp_path / "wal-a", store)
    assert sorted(rec.engine.read("db", "t").column("id").to_pylist()) == list(range(10))
    shutdown(rec.engine)
