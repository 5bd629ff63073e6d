"""`replay` applies its per-LSN rules to each record's LSN range at once: these tests hold
it to the per-LSN meaning (a reference walk over every LSN, as `replay` did before),
on overlapping copies, ranges partly duplicated, gaps, fences and epoch bounds."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import pytest

from tn.logstore.kafka_backend.exceptions import AcknowledgedEntryLostError
from tn.logstore.kafka_backend.headers import KIND_EPOCH, RecordHeader
from tn.logstore.kafka_backend.replay import EntryMap, StoredRecord, epoch_bounds, replay

E = b"entries"


def rec(p: int, off: int, first: int, count: int, epoch: int = 1, tag: str = "") -> StoredRecord:
    payloads = tuple(f"{tag or p}/{off}:{first + i}".encode() for i in range(count))
    return StoredRecord(p, off, RecordHeader(E, epoch, first, count, 0, "w"), payloads)


def marker(p: int, off: int, epoch: int) -> StoredRecord:
    return StoredRecord(p, off, RecordHeader(KIND_EPOCH, epoch))


def reference(
    recs: Sequence[StoredRecord], truncated: int, bases: Mapping[int, int]
) -> tuple[dict[int, bytes], list[tuple[int, int, int, int, int]], list[int], int, int]:
    """The rules walked LSN by LSN: entries, segments, dropped tail, head skipped, zombies."""
    bounds = epoch_bounds(bases, (r.header.epoch for r in recs))
    fence: dict[int, int] = {}
    found: dict[int, tuple[bytes, int, int, int]] = {}
    head = zombies = 0
    for r in recs:
        h = r.header
        if h.kind == KIND_EPOCH:
            fence[r.partition] = max(fence.get(r.partition, 0), h.epoch)
            continue
        if h.epoch < fence.get(r.partition, 0):
            zombies += h.count
            continue
        bound = bounds.get(h.epoch)
        for i, payload in enumerate(r.payloads):
            lsn = h.first + i
            if bound is not None and lsn > bound:
                zombies += 1
            elif lsn <= truncated:
                head += 1
            else:
                found.setdefault(lsn, (payload, r.partition, r.offset, i))
    entries: dict[int, bytes] = {}
    segs: list[list[int]] = []
    lsn = truncated + 1
    while lsn in found:
        payload, p, off, i = found.pop(lsn)
        entries[lsn] = payload
        if segs and segs[-1][2:4] == [p, off]:
            segs[-1][1] = lsn
        else:
            segs.append([lsn, lsn, p, off, i])
        lsn += 1
    return entries, [(a, b, c, d, e) for a, b, c, d, e in segs], sorted(found), head, zombies


def check(
    recs: list[StoredRecord], truncated: int = 0, bases: Mapping[int, int] | None = None
) -> None:
    bases = bases or {}
    entries, segs, tail, head, zombies = reference(recs, truncated, bases)
    r = replay(recs, truncated, bases, epoch=99)
    assert dict(r.entries.items()) == entries
    assert [(s.first, s.last, s.partition, s.offset, s.index) for s in r.segments] == segs
    assert r.tail_dropped == tail
    assert (r.head_skipped, r.zombies_ignored) == (head, zombies)
    assert r.last_lsn == (max(entries) if entries else truncated)


def test_overlapping_copies_first_copy_wins_per_lsn() -> None:
    # 1-8 in one record; a later copy 5-12 fills only 9-12; an earlier short one (3-4,
    # another partition, read first) keeps 3-4: the long record's range is split around it
    recs = [rec(1, 0, 3, 2, tag="early"), rec(0, 0, 1, 8), rec(0, 1, 5, 8)]
    check(recs)
    r = replay(recs, 0, {}, epoch=2)
    assert [(s.first, s.last, s.partition, s.offset, s.index) for s in r.segments] == [
        (1, 2, 0, 0, 0),
        (3, 4, 1, 0, 0),
        (5, 8, 0, 0, 4),
        (9, 12, 0, 1, 4),
    ]
    assert r.entries[4] == b"early/0:4" and r.entries[6] == b"0/0:6" and r.entries[9] == b"0/1:9"


def test_range_partly_duplicated_and_gap_drops_the_tail() -> None:
    # 1-4, then a retry of 3-6 (3-4 duplicated), then 8-9 after a gap at 7
    recs = [rec(0, 0, 1, 4), rec(0, 1, 3, 4), rec(0, 2, 8, 2)]
    check(recs)
    r = replay(recs, 0, {}, epoch=2)
    assert r.last_lsn == 6 and r.tail_dropped == [8, 9]
    assert r.entries[3] == b"0/0:3" and r.entries[5] == b"0/1:5"


def test_head_clip_and_fence_cut_a_range_at_its_ends() -> None:
    recs = [
        rec(0, 0, 1, 6),  # 1-3 head (T = 3), 4-6 kept
        rec(0, 1, 7, 6),  # epoch 1 bounded by base(2) = 9: 10-12 clipped
        marker(0, 2, 2),
        rec(0, 3, 8, 3),  # zombie (epoch 1 after epoch 2's marker)
        rec(0, 4, 10, 3, epoch=2),
    ]
    check(recs, truncated=3, bases={2: 9})
    r = replay(recs, 3, {2: 9}, epoch=3)
    assert (r.head_skipped, r.zombies_ignored, r.last_lsn) == (3, 6, 12)


def test_random_layouts_match_the_per_lsn_rules() -> None:
    rng = random.Random(28)
    for _ in range(400):
        recs: list[StoredRecord] = []
        offsets = [0, 0]
        for _ in range(rng.randint(1, 14)):
            p = rng.randint(0, 1)
            if rng.random() < 0.1:
                recs.append(marker(p, offsets[p], rng.randint(1, 3)))
            else:
                first = rng.randint(1, 30)
                recs.append(rec(p, offsets[p], first, rng.randint(1, 8), rng.randint(1, 3)))
            offsets[p] += 1
        truncated = rng.choice([0, 0, rng.randint(0, 10)])
        bases = {e: rng.randint(truncated, 40) for e in (2, 3) if rng.random() < 0.3}
        try:
            check(recs, truncated, bases)
        except AcknowledgedEntryLostError:
            # step 6 refused (a base above the run): so must the rules' run end below it
            entries = reference(recs, truncated, bases)[0]
            assert max(bases.values()) > (max(entries) if entries else truncated)


def test_entry_map_lookups_and_truncation() -> None:
    m = EntryMap()
    m.add(5, 7, (b"a", b"b", b"c", b"d"), 4)  # a record from 4; its 5..7
    m.add(8, 9, (b"x", b"y"), 8)
    assert list(m) == [5, 6, 7, 8, 9] and len(m) == 5
    assert (m[5], m[7], m[9], m.get(4), m.get(10)) == (b"b", b"d", b"y", None, None)
    with pytest.raises(ValueError):
        m.add(9, 10, (b"z", b"z"), 9)  # not above what is held
    m.drop_through(6)
    assert list(m) == [7, 8, 9] and m[7] == b"d" and 6 not in m
    m.drop_through(9)
    assert list(m) == [] and m.get(9) is None
