"""The checkpoint prunes the key index by the blocks it flushed, not by a pass over it.

Entries of a flushed block's keys go at the checkpoint that flushed it; one a running
transaction still needs (written after its StartTS) stays until a later checkpoint;
a delete of a flushed row puts its key back in the index until the next checkpoint.
Nothing is left waiting once every entry is gone (TableData.unpruned).
"""

from __future__ import annotations

from pathlib import Path

from infra.objectstore import FolderStore
from tests.checkpoint.helpers import create, delete, insert, open_log, shutdown
from tests.checkpoint.test_key_filters import live_keys, table
from tn.checkpoint.runner import CheckpointRunner
from tn.engine import Engine
from tn.memtable.block import BLOCK_ROWS


def test_prune_drops_the_flushed_blocks_keys_and_keeps_what_a_transaction_needs(tmp_path: Path):
    store = FolderStore(tmp_path / "objects")
    eng = Engine(open_log(tmp_path / "wal"))
    runner = CheckpointRunner(eng, store, interval_s=3600)
    create(eng)
    insert(eng, 0, BLOCK_ROWS + 10)  # a full block, and 10 rows in the open one
    t = table(eng)
    assert len(t.mem.index) == BLOCK_ROWS + 10
    assert runner.checkpoint() is not None
    # the full block's keys went; the open block's stay (its rows are in memory)
    assert sorted(t.mem.index) == list(range(BLOCK_ROWS, BLOCK_ROWS + 10))
    assert runner.pruned == BLOCK_ROWS and t.mem.unpruned == {}

    slow = eng.begin()  # its StartTS holds back the pruning of later writes
    slow.insert("db", "t", [{"id": -1, "v": "s", "x": None}])
    delete(eng, [5, 6])  # flushed rows: their keys come back into the index
    assert {5, 6} <= set(t.mem.index)
    assert runner.checkpoint() is not None
    assert {5, 6} <= set(t.mem.index)  # newer than the running transaction's StartTS
    assert sorted(k for ks in t.mem.unpruned.values() for k in ks) == [5, 6]
    slow.commit().result(timeout=30)
    assert runner.checkpoint() is not None
    assert 5 not in t.mem.index and 6 not in t.mem.index
    assert t.mem.unpruned == {}
    # found through the flushed block all the same
    expected = set(range(-1, BLOCK_ROWS + 10)) - {5, 6}
    assert live_keys(eng) == expected
    insert(eng, 5, 6)  # deleted, so it may come back
    assert live_keys(eng) == expected | {5}
    shutdown(eng)
