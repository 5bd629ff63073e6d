"""A checkpoint puts its objects concurrently (`put_workers`): each put waits for the
store (a fsync, a PUT's round trip), and one after another they made a checkpoint of
many blocks last most of its interval. Every object is in the store before the
catalog and the manifest name it."""

from __future__ import annotations

import threading
from pathlib import Path

from infra.objectstore import FolderStore
from tests.checkpoint.helpers import create, insert, open_log, restart, shutdown
from tn.checkpoint.runner import CheckpointRunner
from tn.engine import Engine
from tn.memtable.block import BLOCK_ROWS

BLOCKS = 3


class PairedStore(FolderStore):
    """Holds the 2nd and 3rd block objects until both are being put (a barrier): put one
    after the other, the first of them would wait alone and fail."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.barrier = threading.Barrier(2, timeout=30)
        self.lock = threading.Lock()
        self.data_puts = 0
        self.most_at_once = 0
        self._now = 0

    def put(self, key: str, data: bytes) -> None:
        paired = False
        if key.startswith("data/") and key.endswith(".parquet") and ".delta" not in key:
            with self.lock:
                self.data_puts += 1
                paired = self.data_puts in (2, 3)
        with self.lock:
            self._now += 1
            self.most_at_once = max(self.most_at_once, self._now)
        try:
            if paired:
                self.barrier.wait()
            super().put(key, data)
        finally:
            with self.lock:
                self._now -= 1


def test_objects_are_put_concurrently_and_all_in_the_store_before_the_manifest(tmp_path: Path):
    store = PairedStore(tmp_path / "objects")
    wal = tmp_path / "wal"
    eng = Engine(open_log(wal))
    runner = CheckpointRunner(eng, store, interval_s=3600)
    create(eng)
    insert(eng, 0, BLOCKS * BLOCK_ROWS)
    m = runner.checkpoint()
    assert m is not None and not runner.errors
    assert store.data_puts == BLOCKS and store.most_at_once >= 2
    for key in m.objects:  # every object the manifest lists is there, at its size
        assert store.size(key) == m.objects[key]
    pk = [k for k in m.objects if k.endswith(".pk")]
    assert len(pk) == BLOCKS  # each full block's filter, written by the pool
    expected = eng.read("db", "t").to_pylist()
    shutdown(eng)
    rec = restart(wal, store)
    assert rec.engine.read("db", "t").to_pylist() == expected
    shutdown(rec.engine)
