"""The key index holds the working set; flushed keys are found through key filters.

Duplicate-key inserts, deletes and write conflicts on rows flushed many checkpoints
ago behave as when every key was in memory, also after a restart; the index does not
grow with the history; a filter's false positive costs a key-column read, never a
wrong answer (docs/memory.md).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from infra.objectstore import FolderStore
from tests.checkpoint.helpers import create, delete, insert, open_log, shutdown, update
from tn.catalog.nodes import TableNode
from tn.checkpoint.dump import BlockReader
from tn.checkpoint.recovery import recover
from tn.checkpoint.runner import CheckpointRunner
from tn.engine import Engine
from tn.exceptions import ConflictError, ValidationError
from tn.memtable.block import BLOCK_ROWS

ROUNDS = 5


def table(eng: Engine) -> TableNode:
    db = eng.catalog.database("db", eng.visible_ts)
    assert db is not None
    t = eng.catalog.table(db, "t", eng.visible_ts)
    assert t is not None
    return t


def live_keys(eng: Engine) -> set[int]:
    return set(eng.read("db", "t").column("id").to_pylist())


def test_flushed_keys_behave_as_before_and_the_index_stays_bounded(tmp_path: Path):
    store = FolderStore(tmp_path / "objects")
    wal = tmp_path / "wal"
    eng = Engine(open_log(wal))
    runner = CheckpointRunner(eng, store, interval_s=3600)
    create(eng)
    rng = random.Random(3)
    total = 0
    index_sizes = []
    for _ in range(ROUNDS):  # each round: a full block of new keys, updates, deletes
        insert(eng, total, total + BLOCK_ROWS)
        total += BLOCK_ROWS
        update(eng, [rng.randrange(total) for _ in range(40)], "u")
        delete(eng, sorted({rng.randrange(16, total) for _ in range(20)}))
        assert runner.checkpoint() is not None
        index_sizes.append(len(table(eng).mem.index))
    t = table(eng)
    # the index holds the rows not flushed yet (the open block's), not the history
    assert runner.pruned > 0
    assert max(index_sizes) < 2 * BLOCK_ROWS < total
    assert index_sizes[-1] <= index_sizes[1] + BLOCK_ROWS // 4, index_sizes
    assert len(t.mem.flushed) >= ROUNDS - 1
    expected = live_keys(eng)
    # keys 0..15 were written in the first round, flushed ROUNDS checkpoints ago
    old = [k for k in range(16) if k in expected]
    assert len(old) >= 10
    with pytest.raises(ValidationError, match="duplicate"):
        insert(eng, old[0], old[0] + 1)
    delete(eng, [old[1]])
    expected.discard(old[1])
    assert live_keys(eng) == expected
    insert(eng, old[1], old[1] + 1)  # deleted: its key may come back
    expected.add(old[1])
    # a transaction that began before a write of a flushed key conflicts with it, even
    # after a checkpoint ran in between (it keeps that write's entry in the index)
    slow = eng.begin()
    delete(eng, [old[2]])
    expected.discard(old[2])
    assert runner.checkpoint() is not None
    slow.update("db", "t", [{"id": old[2], "v": "late", "x": None}])
    with pytest.raises(ConflictError):
        slow.commit().result(timeout=10)
    assert live_keys(eng) == expected
    before = eng.read("db", "t").to_pylist()
    shutdown(eng)

    rec = recover(open_log(wal), store)
    eng = rec.engine
    t = table(eng)
    # restart: no index rebuilt from the history; keys are behind the filter objects
    assert len(t.mem.index) < BLOCK_ROWS
    assert eng.read("db", "t").to_pylist() == before
    with pytest.raises(ValidationError, match="duplicate"):
        insert(eng, old[3], old[3] + 1)
    delete(eng, [old[4]])
    expected.discard(old[4])
    update(eng, [old[5]], "after")
    assert live_keys(eng) == expected
    row = [r for r in eng.read("db", "t").to_pylist() if r["id"] == old[5]]
    assert row == [{"id": old[5], "v": f"after{old[5]}", "x": None}]
    delete(eng, [old[4]])  # gone already: a no-op, as before
    assert live_keys(eng) == expected
    shutdown(eng)


def _one_bit_filters(tmp_path: Path) -> tuple[Engine, BlockReader, CheckpointRunner, Path, FolderStore]:
    """An engine whose checkpoints write 1-bit key filters ("maybe" to every key), with
    table db.t created: (engine, its block reader, a checkpoint runner, WAL path, store)."""
    store = FolderStore(tmp_path / "objects")
    wal = tmp_path / "wal"
    eng = Engine(open_log(wal))
    reader = BlockReader(store, bits_per_key=0)
    eng.block_columns = reader
    runner = CheckpointRunner(eng, store, interval_s=3600)
    create(eng)
    return eng, reader, runner, wal, store


def test_a_filter_false_positive_costs_a_read_not_a_wrong_answer(tmp_path: Path):
    eng, reader, runner, wal, store = _one_bit_filters(tmp_path)
    txn = eng.begin()
    evens = [{"id": 2 * i, "v": "e", "x": None} for i in range(BLOCK_ROWS)]
    txn.insert("db", "t", evens)
    txn.commit().result(timeout=30)
    assert runner.checkpoint() is not None
    t = table(eng)
    assert len(t.mem.index) == 0 and len(t.mem.flushed) == 1
    probes = reader.key_probes
    insert(eng, 3, 4)  # odd: inside the zone map, absent: the filter lies, the read tells
    assert reader.key_probes == probes + 1
    delete(eng, [5])  # absent: a no-op
    delete(eng, [4])  # flushed, present: found and deleted
    with pytest.raises(ValidationError, match="duplicate"):
        insert(eng, 6, 7)
    keys = live_keys(eng)
    assert 3 in keys and 4 not in keys and 5 not in keys and 6 in keys
    assert len(keys) == BLOCK_ROWS
    shutdown(eng)
    # restarted with 1-bit filters through the recovery's setting: the filter objects
    # (of another size) are rebuilt from the key column, answers unchanged
    rec = recover(open_log(wal), store, bits_per_key=0)
    eng = rec.engine
    with pytest.raises(ValidationError, match="duplicate"):
        insert(eng, 8, 9)
    insert(eng, 4, 5)
    delete(eng, [10])
    keys = live_keys(eng)
    assert 4 in keys and 10 not in keys and len(keys) == BLOCK_ROWS
    flushed = table(eng).mem.flushed
    assert flushed.loads == 1
    flushed.evict()  # filters dropped from memory: loaded again when needed
    with pytest.raises(ValidationError, match="duplicate"):
        insert(eng, 12, 13)
    assert flushed.loads == 2
    shutdown(eng)


def test_a_block_whose_rows_are_all_deleted_leaves_the_key_filters(tmp_path: Path):
    """A flushed block whose every row was deleted before the oldest active transaction
    began (the requests table's, as the dedup window moves on) loses its key filter at
    the next checkpoint: lookups ask it nothing (1-bit filters: every other block is
    asked every key in its zone), and the answers stay: its keys insert again, deleting
    them is a no-op, live keys elsewhere are still duplicates; also after a restart."""
    eng, reader, runner, wal, store = _one_bit_filters(tmp_path)
    insert(eng, 0, BLOCK_ROWS)  # block 1
    insert(eng, BLOCK_ROWS, 2 * BLOCK_ROWS)  # block 2
    assert runner.checkpoint() is not None
    t = table(eng)
    assert len(t.mem.flushed) == 2
    slow = eng.begin()  # began before the deletes: block 1 must still answer it
    delete(eng, list(range(BLOCK_ROWS)))
    assert runner.checkpoint() is not None
    assert len(t.mem.flushed) == 2
    slow.rollback()
    insert(eng, 3 * BLOCK_ROWS, 3 * BLOCK_ROWS + 1)  # something for the next checkpoint
    assert runner.checkpoint() is not None
    assert len(t.mem.flushed) == 1
    probes = reader.key_probes
    insert(eng, 5, 6)  # block 1's key: no block asked (block 2's zone map says no)
    assert reader.key_probes == probes
    with pytest.raises(ValidationError, match="duplicate"):
        insert(eng, BLOCK_ROWS + 3, BLOCK_ROWS + 4)
    delete(eng, [7])  # deleted long ago: a no-op
    expected = {5, 3 * BLOCK_ROWS} | set(range(BLOCK_ROWS, 2 * BLOCK_ROWS))
    assert live_keys(eng) == expected
    shutdown(eng)
    rec = recover(open_log(wal), store, bits_per_key=0)
    eng = rec.engine
    assert live_keys(eng) == expected
    with pytest.raises(ValidationError, match="duplicate"):
        insert(eng, 5, 6)
    with pytest.raises(ValidationError, match="duplicate"):
        insert(eng, BLOCK_ROWS + 9, BLOCK_ROWS + 10)
    insert(eng, 8, 9)
    assert live_keys(eng) == expected | {8}
    shutdown(eng)
