"""A checkpoint that drops flushed blocks' rows hands the freed memory back to the OS
(tn.checkpoint.release: glibc's malloc_trim, pyarrow's pool); one that drops nothing
does not pay for it."""

from __future__ import annotations

import platform
from pathlib import Path

from infra.objectstore import FolderStore
from tests.checkpoint.helpers import create, delete, insert, open_log, shutdown
from tn.checkpoint.release import release_free_memory
from tn.checkpoint.runner import CheckpointRunner
from tn.engine import Engine
from tn.memtable.block import BLOCK_ROWS


def test_memory_goes_back_after_a_checkpoint_drops_rows(tmp_path: Path):
    store = FolderStore(tmp_path / "objects")
    eng = Engine(open_log(tmp_path / "wal"))
    runner = CheckpointRunner(eng, store, interval_s=3600)
    create(eng)
    insert(eng, 0, 100)  # no full block: dumped, nothing dropped
    assert runner.checkpoint() is not None
    assert runner.releases == 0
    insert(eng, 100, BLOCK_ROWS + 50)  # the first block fills: dropped at the checkpoint
    assert runner.checkpoint() is not None
    assert runner.releases == 1
    delete(eng, [5])  # a delete in the flushed block: a delta object, nothing dropped
    assert runner.checkpoint() is not None
    assert runner.releases == 1
    assert sorted(eng.read("db", "t").column("id").to_pylist()) == [
        k for k in range(BLOCK_ROWS + 50) if k != 5
    ]
    shutdown(eng)


def test_release_trims_glibc_heaps_where_there_is_glibc():
    assert release_free_memory() == (
        platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    )
