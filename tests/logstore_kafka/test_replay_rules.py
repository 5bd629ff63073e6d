"""Replay, window and truncation-plan rules, without a broker (the broker tests follow)."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from tn.logstore.kafka_backend.exceptions import AcknowledgedEntryLostError
from tn.logstore.kafka_backend.headers import (
    HeaderError,
    RecordHeader,
    decode_entries,
    decode_headers,
    encode_entries,
    entries_headers,
    epoch_headers,
)
from tn.logstore.kafka_backend.replay import (
    RecordInfo,
    StoredRecord,
    deletable_offsets,
    record_info,
    replay,
)
from tn.logstore.kafka_backend.retention import Retention, check_retention, safe_retention
from tn.logstore.kafka_backend.window import Window

E = b"entries"


def rec(
    p: int, off: int, first: int, count: int = 1, epoch: int = 1, acked: int = 0
) -> StoredRecord:
    payloads = tuple(f"e{epoch}:{first + i}".encode() for i in range(count))
    return StoredRecord(p, off, RecordHeader(E, epoch, first, count, acked, "w"), payloads)


def marker(p: int, off: int, epoch: int) -> StoredRecord:
    return StoredRecord(p, off, RecordHeader(b"epoch", epoch))


def test_headers_and_framing_round_trip() -> None:
    h = decode_headers(entries_headers(3, 10, 2, 9, "w1"))
    assert (h.kind, h.epoch, h.first, h.count, h.acked, h.writer, h.last) == (
        E,
        3,
        10,
        2,
        9,
        "w1",
        11,
    )
    assert decode_headers(epoch_headers(4, "w2")).kind == b"epoch"
    assert decode_entries(encode_entries([b"a", b"", b"ccc"]), 3) == [b"a", b"", b"ccc"]
    with pytest.raises(HeaderError):
        decode_headers([("x", b"1")])
    with pytest.raises(HeaderError):
        decode_entries(encode_entries([b"a"]), 2)


# Seed 004's worked example: backend positions 1..14 (offsets 0..13) -> logical LSNs.
SEED_LAYOUT = {
    1: 1,
    2: 2,
    3: 3,
    4: 4,
    5: 8,
    6: 15,
    7: 9,
    8: 5,
    9: 6,
    10: 10,
    11: 7,
    12: 11,
    13: 12,
    14: 14,
}


def test_seed_004_example_replay_and_truncation_plan() -> None:
    records = [rec(0, pos - 1, lsn) for pos, lsn in SEED_LAYOUT.items()]
    # truncate to 7 (stored at position 11): positions 5, 6, 7, 10 hold LSNs > 7
    assert deletable_offsets([record_info(r) for r in records], 7) == {0: 4}  # through position 4
    result = replay(records, truncated=7, bases={}, epoch=2)
    assert result.head_skipped == 7  # positions 1-4 and the discontinuous head 8, 9, 11
    assert sorted(result.entries) == [8, 9, 10, 11, 12]
    assert result.last_lsn == 12
    assert result.tail_dropped == [14, 15]  # positions 14 and 6
    assert [(s.first, s.last, s.offset) for s in result.segments] == [
        (8, 8, 4),
        (9, 9, 6),
        (10, 10, 9),
        (11, 11, 11),
        (12, 12, 12),
    ]


def test_discontinuous_head_and_tail_across_partitions() -> None:
    records = [
        rec(0, 0, 1, 3),
        rec(1, 0, 4, 2),
        rec(0, 1, 8, 2),  # 6, 7 missing -> 8, 9 tail
        rec(1, 1, 6, 1),
        rec(0, 2, 11, 1),
    ]
    r = replay(records, truncated=2, bases={}, epoch=2)
    assert sorted(r.entries) == [3, 4, 5, 6]
    assert r.head_skipped == 2
    assert r.tail_dropped == [8, 9, 11]
    assert r.entries[3] == b"e1:3"


def test_zombie_after_newer_marker_is_ignored_and_epoch_bound_clips() -> None:
    records = [
        rec(0, 0, 1, 5, epoch=1, acked=3),
        rec(0, 1, 8, 2, epoch=1),  # epoch-1 tail, pre-marker: above base(2)=5 -> clipped
        marker(0, 2, 2),
        rec(0, 3, 6, 2, epoch=1),  # zombie: after epoch 2's marker
        rec(0, 4, 6, 3, epoch=2, acked=5),
    ]
    r = replay(records, truncated=0, bases={2: 5}, epoch=3)
    assert sorted(r.entries) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert r.entries[6] == b"e2:6" and r.entries[8] == b"e2:8"
    assert r.zombies_ignored == 4


def test_duplicate_record_from_retry_keeps_first_copy() -> None:
    r = replay([rec(0, 0, 1, 2), rec(0, 1, 1, 2), rec(0, 2, 3, 1)], truncated=0, bases={}, epoch=2)
    assert sorted(r.entries) == [1, 2, 3]


def test_acknowledged_entry_missing_refuses_replay() -> None:
    with pytest.raises(AcknowledgedEntryLostError):
        replay([rec(0, 5, 4, 1, acked=3)], truncated=0, bases={}, epoch=2)
    # at or below the truncation point it is fine
    assert replay([rec(0, 5, 4, 1, acked=3)], truncated=3, bases={}, epoch=2).last_lsn == 4


def test_window_acknowledges_in_lsn_order_only() -> None:
    w = Window(size=4, acked=0)
    futs = {n: Future[int]() for n in range(1, 5)}
    for n, f in futs.items():
        assert w.room_for(n)
        w.admit(n, f, 0.0)
    assert not w.room_for(5)
    assert w.durable(3, 4) == []  # out of order: nothing acknowledged yet
    assert w.acked == 0
    assert [n for n, _ in w.durable(1, 2)] == [1, 2, 3, 4]
    assert w.acked == 4 and w.room_for(8) and not w.room_for(9)


def test_retention_guard_and_safe_retention() -> None:
    infos = [RecordInfo(0, i, i + 1, 1_000 * i, 100) for i in range(10)]
    safe = safe_retention(infos, truncated=5, now_ms=20_000, margin=2.0)
    assert safe.oldest_needed_age_ms == 15_000 and safe.min_ms == 30_000
    assert safe.needed_bytes == {0: 500} and safe.min_bytes == 1000
    assert check_retention("w", Retention(-1, -1), safe).warning == ""
    assert "finite" in check_retention("w", Retention(60_000, -1), safe).warning
    with pytest.raises(Exception) as e:
        check_retention("w", Retention(10_000, -1), safe)
    assert getattr(e.value, "setting", None) == "retention.ms"
    with pytest.raises(Exception) as e:
        check_retention("w", Retention(-1, 600), safe)
    assert getattr(e.value, "setting", None) == "retention.bytes"
