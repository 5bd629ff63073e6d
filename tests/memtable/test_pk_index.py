"""PkIndex (tn.memtable.pk_index): the key index as sorted runs plus a small dict must
answer exactly as a plain dict of key -> newest entry: shadowing, deletes, prune (with
the older entries of a pruned key), merges, and keys that are not ints."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from tn.memtable.pk_index import PkIndex

Entry = tuple[int, int, int, bool]


def _small() -> PkIndex:
    # tiny thresholds: every path (recent, runs, freezes, merges) runs on small data
    return PkIndex(recent_max=8, run_min=4)


def test_newest_write_wins_across_recent_and_runs():
    idx = _small()
    idx.set_many(list(range(10)), 1, np.arange(10), 5, True)  # a run
    idx.set(3, 2, 0, 6, True)  # recent shadows the run
    assert idx.get(3) == (2, 0, 6, True)
    assert idx.get(4) == (1, 4, 5, True)
    idx.set_many([9, 3, 20, 21], 3, [0, 1, 2, 3], 7, False)  # a newer run shadows recent
    assert idx.get(3) == (3, 1, 7, False)
    assert idx.get(9) == (3, 0, 7, False)
    assert idx.get(100) is None
    assert idx.get_many([3, 4, 100, 20]) == [(3, 1, 7, False), (1, 4, 5, True), None, (3, 2, 7, False)]
    assert len(idx) == 12 and sorted(idx) == [*range(10), 20, 21]
    assert 21 in idx and 22 not in idx


def test_a_key_given_twice_in_one_bulk_write_takes_its_last():
    idx = _small()
    idx.set_many([5, 1, 5, 2, 1], [1, 1, 2, 2, 3], [0, 1, 2, 3, 4], [10, 11, 12, 13, 14], True)
    assert idx.get(5) == (2, 2, 12, True) and idx.get(1) == (3, 4, 14, True)
    assert len(idx) == 3


def test_conflict_check_sees_only_the_newest_write():
    idx = _small()
    idx.set_many(list(range(40)), 1, np.arange(40), 5, True)
    keys = set(range(0, 40, 2))
    assert idx.newer_than(keys, 5) is None
    assert idx.newer_than(keys, 4) is not None
    idx.set(12, 2, 0, 9, False)
    assert idx.newer_than(keys, 5) == 12
    assert idx.newer_than({12}, 8) == 12 and idx.newer_than({12}, 9) is None
    assert idx.newer_than({1000, 1001}, 0) is None


def test_prune_drops_a_blocks_old_entries_and_never_resurfaces_an_older_one():
    idx = _small()
    idx.set_many(list(range(20)), 1, np.arange(20), 5, True)  # block 1
    idx.set_many(list(range(10, 30)), 2, np.arange(20), 8, True)  # block 2 shadows 10..19
    idx.set(25, 3, 0, 12, False)  # a later delete, in recent
    dropped, kept = idx.prune([2], 10)
    assert dropped == 19 and kept == {}  # 25 points at block 3 now
    # keys 10..19 are gone, not back at block 1's older entries
    assert idx.get_many(list(range(10, 20))) == [None] * 10
    assert idx.get(5) == (1, 5, 5, True) and idx.get(25) == (3, 0, 12, False)
    # an entry newer than upto stays, and is reported kept
    idx.set_many([0, 1, 2, 3], 1, [0, 1, 2, 3], 20, False)
    dropped, kept = idx.prune([1], 10)
    assert dropped == 6 and sorted(kept[1]) == [0, 1, 2, 3]
    assert sorted(idx) == [0, 1, 2, 3, 25]
    dropped, kept = idx.prune([1, 3], 30)
    assert dropped == 5 and kept == {} and len(idx) == 0


def test_many_writes_merge_into_few_runs_and_match_a_dict():
    rng = random.Random(7)
    idx = PkIndex(recent_max=64, run_min=16)
    model: dict[int, Entry] = {}
    ts = 0
    for _ in range(400):
        ts += 1
        n = rng.choice([1, 3, 20, 100])
        keys = [rng.randrange(5000) for _ in range(n)]
        bid = rng.randrange(1, 6)
        live = rng.random() < 0.8
        if n == 1:
            idx.set(keys[0], bid, 7, ts, live)
        else:
            idx.set_many(keys, bid, np.arange(n), ts, live)
        for i, k in enumerate(keys):
            model[k] = (bid, 7 if n == 1 else i, ts, live)
        if rng.random() < 0.05:  # a checkpoint
            bids = rng.sample(range(1, 6), 2)
            upto = ts - rng.randrange(20)
            gone = {k for k, e in model.items() if e[0] in bids and e[2] <= upto}
            idx.prune(bids, upto)
            model = {k: e for k, e in model.items() if k not in gone}
    assert idx.stats()["runs"] <= 8
    probe = list(range(5000))
    assert idx.get_many(probe) == [model.get(k) for k in probe]
    assert len(idx) == len(model)
    for k in rng.sample(probe, 50):
        assert idx.get(k) == model.get(k)
    late = {k for k, e in model.items() if e[2] > ts - 10}
    found = idx.newer_than(set(probe), ts - 10)
    assert (found in late) if late else found is None


def test_keys_that_are_not_ints_stay_in_a_dict():
    idx = _small()
    keys: list[Any] = [f"k{i}" for i in range(30)]
    idx.set_many(keys, 1, np.arange(30), 5, True)
    idx.set("k3", 2, 0, 6, False)
    assert idx.stats()["runs"] == 0 and len(idx) == 30
    assert idx.get("k3") == (2, 0, 6, False) and idx.get("k4") == (1, 4, 5, True)
    assert idx.newer_than(set(keys), 5) == "k3"
    dropped, kept = idx.prune([1], 5)
    assert dropped == 29 and kept == {} and list(idx) == ["k3"]
