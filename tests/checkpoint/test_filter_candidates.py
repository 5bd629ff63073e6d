"""Finding keys in flushed blocks: `FlushedKeys.candidates` (the stacked filters and zone
maps) names exactly the blocks that may hold a key, however slots are reused, grown or
evicted (the zone maps of integer keys are checked vectorized, the others one by one),
and a block's key column read back finds every row of a key (docs/memory.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from infra.objectstore import FolderStore
from schemas.logtail import ROW_ID
from tn.checkpoint.dump import COLUMNS_META, BlockReader, IntKeys, to_parquet
from tn.memtable.flushed import DroppedCols, FlushedKeys
from tn.memtable.pk_filter import KeyFilter


class _Blk:
    """The little of a BlockNode that FlushedKeys reads."""

    def __init__(self, bid: int) -> None:
        self.id = bid


class _Filters:
    """The reader's part that loads a block's filter again (after `evict`)."""

    def __init__(self) -> None:
        self.by_id: dict[int, KeyFilter] = {}

    def key_filter(self, blk: _Blk, pk: int, m: int) -> KeyFilter:
        return self.by_id[blk.id]


def _found(fk: FlushedKeys, keys: list[Any], reader: Any = None) -> set[tuple[Any, int]]:
    return {(keys[i], b.id) for i, b in fk.candidates(keys, reader, 1, 1)}


def test_int_zone_maps_name_exactly_the_blocks_whose_range_holds_the_key():
    fk = FlushedKeys()
    # 1-bit filters: every filter says "maybe"; only the zone maps decide
    for b in range(40):  # more than the matrix's first capacity (16): it grows twice
        fk.register(_Blk(b), KeyFilter.build(list(range(100 * b, 100 * b + 100)), 1))  # type: ignore[arg-type]
    keys = [5, 150, 3999, 4000, -1, 2**63 - 1]
    assert _found(fk, keys) == {(5, 0), (150, 1), (3999, 39)}
    # a forgotten block's slot is reused with the new block's zone map
    fk.forget(_Blk(1))  # type: ignore[arg-type]
    fk.register(_Blk(99), KeyFilter.build(list(range(5000, 5100)), 1))  # type: ignore[arg-type]
    assert _found(fk, [150, 5050, 120]) == {(5050, 99)}
    # overlapping ranges: both blocks
    fk.register(_Blk(100), KeyFilter.build([0, 250], 1))  # type: ignore[arg-type]
    assert _found(fk, [5, 150, 260]) == {(5, 0), (5, 100), (150, 100), (260, 2)}


def test_the_zone_of_every_block_follows_the_slots():
    """Int keys outside the smallest lo .. largest hi of the slots are in no block (asked
    before any hash); that zone is worked out again after each register, forget, evict."""
    fk = FlushedKeys()
    reader = _Filters()
    reader.by_id = {0: KeyFilter.build(list(range(100)), 1)}
    fk.register(_Blk(0), reader.by_id[0])  # type: ignore[arg-type]
    assert _found(fk, [150, 99]) == {(99, 0)}
    assert fk.candidates(np.arange(150, 1150, dtype=np.int64), None, 1, 1) == []  # type: ignore[arg-type]
    reader.by_id[1] = KeyFilter.build(list(range(100, 200)), 1)
    fk.register(_Blk(1), reader.by_id[1])  # type: ignore[arg-type]
    assert _found(fk, [150, 250]) == {(150, 1)}
    many = np.arange(150, 1150, dtype=np.int64)  # an array, partly inside
    assert [(int(many[i]), b.id) for i, b in fk.candidates(many, None, 1, 1)] == [  # type: ignore[arg-type]
        (k, 1) for k in range(150, 200)
    ]
    fk.forget(_Blk(1))  # type: ignore[arg-type]
    reader.by_id[2] = KeyFilter.build(list(range(1000, 1100)), 1)
    fk.register(_Blk(2), reader.by_id[2])  # type: ignore[arg-type]
    assert _found(fk, [150, 1050, 5000]) == {(1050, 2)}
    fk.evict()
    assert _found(fk, [-5, 1050, 99], reader) == {(1050, 2), (99, 0)}


def test_keys_or_zone_maps_that_are_not_int64_are_checked_one_by_one():
    fk = FlushedKeys()
    reader = _Filters()
    reader.by_id = {
        1: KeyFilter.build(["apple", "cherry"], 1),
        2: KeyFilter.build([10, 20], 1),
        3: KeyFilter.build([2**70, 2**71], 1),
        4: KeyFilter(1, None, None, KeyFilter.build([1], 1).bits),
    }
    for bid, flt in reader.by_id.items():
        fk.register(_Blk(bid), flt)  # type: ignore[arg-type]
    # int keys: the string zone cannot be compared ("maybe"), the int zone decides, the
    # too-large zone is checked exactly, no zone map means "maybe"
    assert _found(fk, [15, 2**70 + 1, 30]) == {
        (15, 1), (15, 2), (15, 4),
        (2**70 + 1, 1), (2**70 + 1, 3), (2**70 + 1, 4),
        (30, 1), (30, 4),
    }
    assert _found(fk, ["banana", "zebra"]) == {
        ("banana", 1), ("banana", 2), ("banana", 3), ("banana", 4),
        ("zebra", 2), ("zebra", 3), ("zebra", 4),
    }
    # dropped from memory, then loaded again (in another slot order) at the next lookup
    fk.evict()
    assert len(fk.slot_of) == 0 and len(fk) == 4
    assert _found(fk, [15, 30], reader) == {(15, 1), (15, 2), (15, 4), (30, 1), (30, 4)}
    assert fk.loads == 4


def test_a_block_key_column_read_back_finds_every_row_of_a_key(tmp_path: Path):
    """BlockReader.keys/key_rows: int64 keys as arrays (IntKeys), found by binary search,
    a key at two rows (deleted, then inserted again in the same block) at both, offsets
    without a row read as None; string keys through a dict, the same answers."""
    store = FolderStore(tmp_path)
    reader = BlockReader(store)
    offsets = [0, 1, 2, 5, 6]
    for loc, keys in (("ints.parquet", [7, -3, 2**62, 7, 11]), ("strs.parquet", ["b", "a", "zz", "b", "c"])):
        store.put(
            loc,
            to_parquet(
                pa.table(
                    {ROW_ID: pa.array(offsets, pa.int64()), "k": pa.array(keys)},
                    metadata={COLUMNS_META: json.dumps({"k": 1}).encode()},
                )
            ),
        )
        col = reader.keys(loc, 1, 8)
        assert list(col) == [keys[0], keys[1], keys[2], None, None, keys[3], keys[4], None]
        assert col[5] == keys[3] and col[3] is None and col[1:3] == keys[1:3]
        assert DroppedCols(loc, pk_cid=1, reader=reader, n=8)[1] == list(col)
        first, second, third = keys[0], keys[1], keys[2]
        found = dict(reader.key_rows(loc, 1, 8).find([first, second, third, "nope", 12, 2**70]))
        assert found == {first: (0, 5), second: (1,), third: (2,)}
    assert isinstance(reader.keys("ints.parquet", 1, 8), IntKeys)
    assert all(type(k) is int for k in reader.keys("ints.parquet", 1, 8) if k is not None)
