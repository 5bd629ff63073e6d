"""leveldb log_test's cases, each in the four recovery modes: which entries come back.

Each case builds a segment directory byte by byte (tests/logstore/helpers.py),
damages it, opens a `FileDriver` in every mode and asserts exactly which LSNs
are read back (payloads intact), or that the mode raises an error naming the
file and offset. When the mode recovers, one more entry is appended, and a
reopen must return the recovered entries followed by it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tn.logstore.driver import LogStore
from tn.logstore.file_backend import (
    CorruptLogError,
    DamageKind,
    FileDriver,
    RecoveryError,
)
from tn.logstore.file_backend.format import BLOCK_SIZE, HEADER_SIZE, LSN_SIZE, RecordType
from tn.logstore.file_backend.segments import segment_name

from .helpers import (
    fill_block,
    flip_byte,
    header_at,
    increment_length,
    payload,
    poke,
    set_type,
    truncate_file,
    write_segment,
)

PIT = "point-in-time"
TCT = "tolerate-corrupted-tail"
ABS = "absolute-consistency"
SKIP = "skip-any-corrupted"
MODES = [PIT, TCT, ABS, SKIP]

Expect = list[int] | type[Exception]


@dataclass
class Case:
    entries: dict[int, bytes]
    expect: dict[str, Expect]
    error_at: tuple[Path, int] | None = None  # (file, offset) an error must name
    kinds: tuple[DamageKind, ...] = ()  # what skip-any-corrupted must report


def _entries(sizes: list[int], first: int = 1) -> list[tuple[int, bytes]]:
    return [(first + i, payload(first + i, s)) for i, s in enumerate(sizes)]


def _all(lsns: list[int]) -> dict[str, Expect]:
    return {m: lsns for m in MODES}


def _tail(lsns: list[int]) -> dict[str, Expect]:
    return {PIT: lsns, TCT: lsns, ABS: CorruptLogError, SKIP: lsns}


def _middle(pit: list[int], skip: list[int]) -> dict[str, Expect]:
    return {PIT: pit, TCT: CorruptLogError, ABS: CorruptLogError, SKIP: skip}


# -- the cases ---------------------------------------------------------------


def empty_dir(d: Path) -> Case:
    return Case({}, _all([]))


def empty_file(d: Path) -> Case:
    write_segment(d, [])
    return Case({}, _all([]))


def many_blocks(d: Path) -> Case:
    entries = _entries([(i * 37) % 300 for i in range(3000)])
    write_segment(d, entries)
    return Case(dict(entries), _all([lsn for lsn, _ in entries]))


def fragmentation(d: Path) -> Case:
    entries = _entries([100, 50_000, 100, 70_000, 10])
    write_segment(d, entries)
    return Case(dict(entries), _all([1, 2, 3, 4, 5]))


def big_record(d: Path) -> Case:
    entries = _entries([10, 5 * BLOCK_SIZE + 123, 10])  # FIRST, 4 MIDDLE, LAST
    write_segment(d, entries)
    return Case(dict(entries), _all([1, 2, 3]))


def _trailer(left: int) -> Callable[[Path], Case]:
    """First record leaves exactly `left` bytes in block 0 (leveldb MarginalTrailer...)."""

    def build(d: Path) -> Case:
        first = BLOCK_SIZE - left - HEADER_SIZE - LSN_SIZE
        entries = _entries([first, 100, 40_000, 5])
        path, offsets = write_segment(d, entries)
        if left < HEADER_SIZE:
            assert offsets[1] == BLOCK_SIZE  # the header moved to the next block
        else:
            assert header_at(path, offsets[1])[1:] == (0, RecordType.FIRST)
        return Case(dict(entries), _all([1, 2, 3, 4]))

    return build


def cut_in_trailer(d: Path) -> Case:
    """The file ends inside a block's zero trailer: nothing is lost or damaged,
    and appends must resume at the end of the last record, not of the file."""
    entries = _entries([BLOCK_SIZE - 5 - HEADER_SIZE - LSN_SIZE, 100])
    path, _ = write_segment(d, entries)
    truncate_file(path, BLOCK_SIZE - 2)
    return Case(dict(entries[:1]), _all([1]))


def torn_header(d: Path, keep: int = 3) -> Case:
    entries = _entries([100, 200, 300])
    path, offsets = write_segment(d, entries)
    truncate_file(path, offsets[2] + keep)
    return Case(dict(entries), _tail([1, 2]), (path, offsets[2]), (DamageKind.TORN_HEADER,))


def torn_payload(d: Path) -> Case:
    entries = _entries([100, 200, 300])
    path, offsets = write_segment(d, entries)
    truncate_file(path, offsets[2] + HEADER_SIZE + 20)
    return Case(dict(entries), _tail([1, 2]), (path, offsets[2]), (DamageKind.TORN_PAYLOAD,))


def torn_fragmented(d: Path) -> Case:
    """FIRST then EOF in the next block: leveldb's MissingLastIsIgnored."""
    entries = _entries([100, 200, 3 * BLOCK_SIZE])
    path, offsets = write_segment(d, entries)
    truncate_file(path, 2 * BLOCK_SIZE + 100)
    return Case(dict(entries), _tail([1, 2]), (path, offsets[2]), (DamageKind.TORN_RECORD,))


def zero_tail(d: Path) -> Case:
    """Zeros to EOF: what the writer preallocates, the clean end in every mode."""
    entries = _entries([100, 200])
    path, _ = write_segment(d, entries)
    poke(path, path.stat().st_size, bytes(5000))
    return Case(dict(entries), _all([1, 2]))


def zero_fill_middle(d: Path) -> Case:
    """Zeros where records were, valid records after: corruption, not an end."""
    entries = _entries([900] * 60)
    path, offsets = write_segment(d, entries)
    poke(path, offsets[2], bytes(offsets[4] - offsets[2]))  # entries 3 and 4 zeroed
    later = [lsn for (lsn, _), off in zip(entries, offsets, strict=True) if off >= BLOCK_SIZE]
    kinds = (DamageKind.ZERO_FILL, DamageKind.UNEXPECTED_LAST, DamageKind.LSN_GAP)
    return Case(dict(entries), _middle([1, 2], [1, 2, *later]), (path, offsets[2]), kinds)


def bad_crc_last_record(d: Path) -> Case:
    """The last record's bytes are wrong and nothing follows: a torn write of it."""
    entries = _entries([100, 200, 300])
    path, offsets = write_segment(d, entries)
    flip_byte(path, offsets[2] + HEADER_SIZE + 50)
    return Case(dict(entries), _tail([1, 2]), (path, offsets[2]), (DamageKind.BAD_CRC,))


def torn_write_into_preallocation(d: Path) -> Case:
    """A group written over preallocated zeros, partly lost: the last record is
    zeros from its middle on, and zeros run to EOF."""
    entries = _entries([100, 200, 3000])
    path, offsets = write_segment(d, entries)
    end = path.stat().st_size
    poke(path, offsets[2] + HEADER_SIZE + 1000, bytes(end - offsets[2] + 8000))
    return Case(dict(entries), _tail([1, 2]), (path, offsets[2]), (DamageKind.BAD_CRC,))


def bad_crc_middle(d: Path) -> Case:
    """One record per block; entry 3's payload corrupt."""
    entries = [(i, fill_block(i)) for i in range(1, 6)]
    path, offsets = write_segment(d, entries)
    flip_byte(path, offsets[2] + HEADER_SIZE + 100)
    return Case(
        dict(entries), _middle([1, 2], [1, 2, 4, 5]), (path, offsets[2]), (DamageKind.BAD_CRC,)
    )


def bad_crc_drops_block(d: Path) -> Case:
    """A checksum mismatch drops the rest of its block (the length may be the bad field):
    entries after it in block 0 are lost, a record straddling into block 1 is an
    UNEXPECTED_LAST there, entries starting in block 1 come back."""
    entries = _entries([900] * 60)
    path, offsets = write_segment(d, entries)
    flip_byte(path, offsets[1])  # entry 2's crc
    later = [lsn for (lsn, _), off in zip(entries, offsets, strict=True) if off >= BLOCK_SIZE]
    kinds = (DamageKind.BAD_CRC, DamageKind.UNEXPECTED_LAST, DamageKind.LSN_GAP)
    return Case(dict(entries), _middle([1], [1, *later]), (path, offsets[1]), kinds)


def bad_length(d: Path) -> Case:
    """leveldb BadLength: block 0 is one record whose length grew by one."""
    entries = [(1, fill_block(1)), (2, payload(2, 3))]
    path, offsets = write_segment(d, entries)
    increment_length(path, offsets[0])
    return Case(dict(entries), _middle([], [2]), (path, 0), (DamageKind.BAD_LENGTH,))


def bad_length_at_end(d: Path) -> Case:
    """leveldb BadLengthAtEndIsIgnored: in the last, partial block it is a torn payload."""
    entries = _entries([100, 3])
    path, offsets = write_segment(d, entries)
    increment_length(path, offsets[1])
    return Case(dict(entries), _tail([1]), (path, offsets[1]), (DamageKind.TORN_PAYLOAD,))


def unexpected_middle(d: Path) -> Case:
    entries = _entries([10, 20, 30])
    path, offsets = write_segment(d, entries)
    set_type(path, offsets[1], RecordType.MIDDLE)
    kinds = (DamageKind.UNEXPECTED_MIDDLE, DamageKind.LSN_GAP)
    return Case(dict(entries), _middle([1], [1, 3]), (path, offsets[1]), kinds)


def unexpected_last(d: Path) -> Case:
    entries = _entries([10, 20, 30])
    path, offsets = write_segment(d, entries)
    set_type(path, offsets[1], RecordType.LAST)
    kinds = (DamageKind.UNEXPECTED_LAST, DamageKind.LSN_GAP)
    return Case(dict(entries), _middle([1], [1, 3]), (path, offsets[1]), kinds)


def unexpected_full(d: Path) -> Case:
    """leveldb UnexpectedFullType: a FIRST followed by a FULL (FIRST without LAST)."""
    entries = _entries([10, 20, 30])
    path, offsets = write_segment(d, entries)
    set_type(path, offsets[1], RecordType.FIRST)
    kinds = (DamageKind.MISSING_LAST, DamageKind.LSN_GAP)
    return Case(dict(entries), _middle([1], [1, 3]), (path, offsets[1]), kinds)


def unexpected_first(d: Path) -> Case:
    """leveldb UnexpectedFirstType: a FIRST followed by another (fragmented) record."""
    entries = _entries([10, 20, 2 * BLOCK_SIZE, 30])
    path, offsets = write_segment(d, entries)
    set_type(path, offsets[1], RecordType.FIRST)
    kinds = (DamageKind.MISSING_LAST, DamageKind.LSN_GAP)
    return Case(dict(entries), _middle([1], [1, 3, 4]), (path, offsets[1]), kinds)


def bad_type(d: Path) -> Case:
    entries = _entries([10, 20, 30])
    path, offsets = write_segment(d, entries)
    set_type(path, offsets[1], 9)
    kinds = (DamageKind.BAD_TYPE, DamageKind.LSN_GAP)
    return Case(dict(entries), _middle([1], [1, 3]), (path, offsets[1]), kinds)


def error_joins_records(d: Path) -> Case:
    """leveldb ErrorJoinsRecords: a record's tail and the next record's head are
    wiped by zeroing a whole block; the two halves must not be joined."""
    entries = _entries([BLOCK_SIZE + 100, BLOCK_SIZE + 100, 10])
    path, offsets = write_segment(d, entries)
    poke(path, BLOCK_SIZE, bytes(BLOCK_SIZE))  # block 1: LAST of #1 and FIRST of #2
    return Case(dict(entries), _middle([], [3]), (path, 0))


def lsn_gap(d: Path) -> Case:
    entries = [(1, payload(1, 10)), (2, payload(2, 10)), (4, payload(4, 10)), (5, payload(5, 10))]
    path, offsets = write_segment(d, entries)
    return Case(
        dict(entries), _middle([1, 2], [1, 2, 4, 5]), (path, offsets[2]), (DamageKind.LSN_GAP,)
    )


def lsn_regression(d: Path) -> Case:
    entries = [(1, payload(1, 10)), (2, payload(2, 10)), (2, payload(2, 10)), (3, payload(3, 10))]
    path, offsets = write_segment(d, entries)
    kinds = (DamageKind.LSN_REGRESSION,)
    return Case(
        dict(entries[:2] + entries[3:]), _middle([1, 2], [1, 2, 3]), (path, offsets[2]), kinds
    )


def later_segment_after_corruption(d: Path) -> Case:
    """Corruption in the middle of segment 1 of 3: point-in-time cuts there and
    sets segments 2 and 3 aside."""
    s1 = _entries([100] * 5, 1)
    s2 = _entries([100] * 5, 6)
    s3 = _entries([100] * 5, 11)
    path, offsets = write_segment(d, s1)
    write_segment(d, s2)
    write_segment(d, s3)
    flip_byte(path, offsets[3] + HEADER_SIZE + 2)
    every = dict(s1 + s2 + s3)
    skip = [1, 2, 3, *range(6, 16)]  # entry 5 shared the damaged block
    return Case(every, _middle([1, 2, 3], skip), (path, offsets[3]), (DamageKind.BAD_CRC,))


def torn_tail_in_older_segment(d: Path) -> Case:
    """A torn record at the end of a segment that is not the newest is corruption."""
    s1 = _entries([100] * 3, 1)
    s2 = _entries([100] * 3, 4)
    path, offsets = write_segment(d, s1)
    write_segment(d, s2)
    truncate_file(path, offsets[2] + 3)
    return Case(dict(s1 + s2), _middle([1, 2], [1, 2, 4, 5, 6]), (path, offsets[2]))


CASES: dict[str, Callable[[Path], Case]] = {
    "empty_dir": empty_dir,
    "empty_file": empty_file,
    "many_blocks": many_blocks,
    "fragmentation": fragmentation,
    "big_record": big_record,
    "trailer_0": _trailer(0),
    "trailer_1": _trailer(1),
    "trailer_6": _trailer(6),
    "trailer_exact_header": _trailer(HEADER_SIZE),
    "cut_in_trailer": cut_in_trailer,
    "torn_header_1": lambda d: torn_header(d, 1),
    "torn_header_6": lambda d: torn_header(d, 6),
    "torn_payload": torn_payload,
    "torn_fragmented": torn_fragmented,
    "zero_tail": zero_tail,
    "zero_fill_middle": zero_fill_middle,
    "bad_crc_last_record": bad_crc_last_record,
    "torn_write_into_preallocation": torn_write_into_preallocation,
    "bad_crc_middle": bad_crc_middle,
    "bad_crc_drops_block": bad_crc_drops_block,
    "bad_length": bad_length,
    "bad_length_at_end": bad_length_at_end,
    "unexpected_middle": unexpected_middle,
    "unexpected_last": unexpected_last,
    "unexpected_full": unexpected_full,
    "unexpected_first": unexpected_first,
    "bad_type": bad_type,
    "error_joins_records": error_joins_records,
    "lsn_gap": lsn_gap,
    "lsn_regression": lsn_regression,
    "later_segment_after_corruption": later_segment_after_corruption,
    "torn_tail_in_older_segment": torn_tail_in_older_segment,
}


def _read_all(driver: FileDriver) -> list[tuple[int, bytes]]:
    return [(r.lsn, r.payload) for r in LogStore(driver).records(max_bytes=50_000)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(CASES))
def test_recovery_mode(tmp_path: Path, name: str, mode: str) -> None:
    d = tmp_path / "wal"
    case = CASES[name](d)
    expect = case.expect[mode]
    if not isinstance(expect, list):
        with pytest.raises(expect) as info:
            FileDriver(d, recovery_mode=mode)
        assert isinstance(info.value, RecoveryError)
        if case.error_at is not None:
            path, offset = case.error_at
            assert str(path) in str(info.value)
            assert f"offset {offset}" in str(info.value)
        return
    driver = FileDriver(d, recovery_mode=mode)
    try:
        got = _read_all(driver)
        assert [lsn for lsn, _ in got] == expect
        assert all(data == case.entries[lsn] for lsn, data in got)
        last = expect[-1] if expect else 0
        assert driver.last_lsn() == last
        if mode == SKIP and case.kinds:
            assert {dmg.kind for dmg in driver.recovery.skipped} | (
                {driver.recovery.cut.kind} if driver.recovery.cut else set()
            ) >= set(case.kinds)
        # New appends follow valid data: they survive a reopen, right after it.
        extra = payload(last + 1, 1234)
        assert LogStore(driver).append(extra).result(timeout=10) == last + 1
    finally:
        driver.close()
    reopened = FileDriver(d, recovery_mode=mode)
    try:
        got = _read_all(reopened)
        assert [lsn for lsn, _ in got] == [*expect, last + 1]
        assert got[-1][1] == extra
        if mode != SKIP:
            assert reopened.recovery.cut is None and not reopened.recovery.skipped
    finally:
        reopened.close()


def test_point_in_time_cuts_tail_and_sets_later_segments_aside(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    case = later_segment_after_corruption(d)
    assert case.error_at is not None
    path, offset = case.error_at
    driver = FileDriver(d)
    try:
        assert driver.recovery.cut is not None
        assert driver.recovery.cut.kind is DamageKind.BAD_CRC
        assert driver.recovery.cut.offset == offset
        assert path.stat().st_size == offset  # cut right after the last good record
        assert sorted(p.name for p in driver.recovery.dropped) == [
            segment_name(6) + ".dropped",
            segment_name(11) + ".dropped",
        ]
        assert not (d / segment_name(6)).exists()
    finally:
        driver.close()


def test_torn_tail_is_cut_on_disk(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    case = torn_payload(d)
    assert case.error_at is not None
    path, offset = case.error_at
    FileDriver(d, recovery_mode=TCT).close()
    assert path.stat().st_size == offset


def test_read_only_open_repairs_nothing(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    case = torn_payload(d)
    assert case.error_at is not None
    path, _ = case.error_at
    size = path.stat().st_size
    driver = FileDriver(d, read_only=True)
    assert [lsn for lsn, _ in _read_all(driver)] == [1, 2]
    assert driver.append(3, b"x").exception() is not None
    driver.close()
    assert path.stat().st_size == size


def test_missing_head_segment_is_an_error(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    write_segment(d, _entries([10, 10], 5))
    for mode in (PIT, TCT, ABS):
        with pytest.raises(RecoveryError, match="segments are missing"):
            FileDriver(d, recovery_mode=mode)
    driver = FileDriver(d, recovery_mode=SKIP)
    try:
        assert [lsn for lsn, _ in _read_all(driver)] == [5, 6]
    finally:
        driver.close()


def test_unknown_mode_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="point-in-time"):
        FileDriver(tmp_path, recovery_mode="best-effort")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(0, 3 * BLOCK_SIZE), min_size=1, max_size=10),
    damage=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 255)), min_size=1, max_size=4),
    cut=st.floats(0.5, 1.0),
    mode=st.sampled_from(MODES),
)
def test_random_damage_never_yields_a_wrong_entry(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    damage: list[tuple[float, int]],
    cut: float,
    mode: str,
) -> None:
    """Flip random bytes and cut the file anywhere: every mode either raises a
    RecoveryError or returns entries with their exact payloads, in LSN order."""
    d = tmp_path_factory.mktemp("wal")
    entries = _entries(sizes)
    path, _ = write_segment(d, entries)
    size = path.stat().st_size
    for where, xor in damage:
        off = min(size - 1, int(where * size))
        with open(path, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ xor]))
    truncate_file(path, int(size * cut))
    try:
        driver = FileDriver(d, recovery_mode=mode)
    except RecoveryError:
        assert mode != SKIP
        return
    try:
        got = _read_all(driver)
        lsns = [lsn for lsn, _ in got]
        assert lsns == sorted(set(lsns))
        assert all(data == dict(entries)[lsn] for lsn, data in got)
        if mode != SKIP:
            assert lsns == list(range(1, len(lsns) + 1))
        assert LogStore(driver).append(b"after").result(timeout=10) == driver.last_lsn()
    finally:
        driver.close()


@settings(
    max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(0, 2 * BLOCK_SIZE), min_size=1, max_size=6),
    damage=st.lists(
        st.tuples(st.floats(0, 1), st.binary(min_size=1, max_size=8)), min_size=1, max_size=4
    ),
    cut=st.floats(0.3, 1.0),
)
def test_fuzzed_files_read_only_never_yield_a_wrong_entry(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    damage: list[tuple[float, bytes]],
    cut: float,
) -> None:
    """The reader under 1,000 damaged files (issue 31's fuzzing): runs of bytes overwritten
    anywhere (headers, CRCs, lengths, types, payloads), the file cut anywhere; each file
    opened read-only in every mode (nothing repaired, no fsync: cheap enough for a thousand).
    Each mode raises a RecoveryError naming the damage or returns entries with their exact
    payloads, LSNs increasing; the strict modes return a prefix 1..n."""
    d = tmp_path_factory.mktemp("wal")
    entries = _entries(sizes)
    path, _ = write_segment(d, entries)
    size = path.stat().st_size
    for where, data in damage:
        at = min(size - 1, int(where * size))
        poke(path, at, data[: size - at])  # overwrite, never extend
    truncate_file(path, int(size * cut))
    expected = dict(entries)
    for mode in MODES:
        try:
            driver = FileDriver(d, recovery_mode=mode, read_only=True)
        except RecoveryError as e:
            assert mode != SKIP
            assert str(path.name) in str(e) or "segment" in str(e), e
            continue
        try:
            got = _read_all(driver)
        finally:
            driver.close()
        lsns = [lsn for lsn, _ in got]
        assert lsns == sorted(set(lsns))
        assert all(data == expected[lsn] for lsn, data in got)
        if mode != SKIP:
            assert lsns == list(range(1, len(lsns) + 1))
