"""The leveldb format pieces: crc mask, header layout, writer fragmentation, reader round trip."""

from __future__ import annotations

import io
import struct
import tempfile
from pathlib import Path

import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from tn.logstore.driver import LogStore
from tn.logstore.file_backend import FileDriver
from tn.logstore.file_backend.format import (
    BLOCK_SIZE,
    HEADER_SIZE,
    RecordType,
    decode_lsn,
    encode_entry,
    mask,
    record_crc,
    unmask,
)
from tn.logstore.file_backend.reader import LogReader, Record
from tn.logstore.file_backend.writer import LogWriter

from .helpers import payload, truncate_file, write_segment


def test_crc32c_and_mask_are_leveldbs() -> None:
    assert crc32c.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    crc = crc32c.crc32c(b"foo")
    assert mask(crc) != crc
    assert mask(mask(crc)) != crc
    assert unmask(mask(crc)) == crc
    assert unmask(unmask(mask(mask(crc)))) == crc
    rot = ((crc >> 15) | (crc << 17)) & 0xFFFFFFFF
    assert mask(crc) == (rot + 0xA282EAD8) & 0xFFFFFFFF


def test_full_record_layout() -> None:
    out = bytearray()
    LogWriter().add_record(b"foo", out)
    crc, length, rtype = struct.unpack("<IHB", out[:HEADER_SIZE])
    assert (length, rtype) == (3, RecordType.FULL)
    assert crc == mask(crc32c.crc32c(bytes([RecordType.FULL]) + b"foo"))
    assert crc == record_crc(RecordType.FULL, b"foo")
    assert out[HEADER_SIZE:] == b"foo"


def _types(out: bytes) -> list[tuple[int, int]]:
    """(type, length) of each physical record of a well-formed buffer."""
    pos, found = 0, []
    while pos < len(out):
        left = BLOCK_SIZE - pos % BLOCK_SIZE
        if left < HEADER_SIZE:
            assert out[pos : pos + left] == bytes(left)  # zero trailer
            pos += left
            continue
        _, length, rtype = struct.unpack_from("<IHB", out, pos)
        found.append((rtype, length))
        pos += HEADER_SIZE + length
    return found


def test_fragmentation_first_middle_last() -> None:
    out = bytearray()
    LogWriter().add_record(bytes(3 * BLOCK_SIZE), out)
    avail = BLOCK_SIZE - HEADER_SIZE
    assert _types(bytes(out)) == [
        (RecordType.FIRST, avail),
        (RecordType.MIDDLE, avail),
        (RecordType.MIDDLE, avail),
        (RecordType.LAST, 3 * BLOCK_SIZE - 3 * avail),
    ]


def test_trailer_is_zero_padded_and_exact_header_gets_empty_first() -> None:
    w, out = LogWriter(), bytearray()
    w.add_record(bytes(BLOCK_SIZE - HEADER_SIZE - 3), out)  # leaves 3 bytes
    w.add_record(b"x", out)
    assert out[BLOCK_SIZE - 3 : BLOCK_SIZE] == bytes(3)
    assert _types(bytes(out))[1] == (RecordType.FULL, 1)
    w, out = LogWriter(), bytearray()
    w.add_record(bytes(BLOCK_SIZE - 2 * HEADER_SIZE), out)  # leaves exactly a header
    w.add_record(b"xy", out)
    assert _types(bytes(out))[1:] == [(RecordType.FIRST, 0), (RecordType.LAST, 2)]


def test_writer_resumes_mid_block() -> None:
    w = LogWriter(file_size=BLOCK_SIZE * 3 + BLOCK_SIZE - 10)
    out = bytearray()
    w.add_record(b"abcdef", out)  # 10 left: header + 3 bytes, then LAST in the next block
    assert w.block_offset == HEADER_SIZE + 3


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 3 * BLOCK_SIZE), max_size=12),
    st.integers(0, BLOCK_SIZE - 1),
)
def test_reader_returns_what_the_writer_wrote(sizes: list[int], start: int) -> None:
    records = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    w, out = LogWriter(start), bytearray(start)
    for r in records:
        w.add_record(r, out)
    got = list(LogReader(io.BytesIO(bytes(out)), "mem", start=start))
    assert all(isinstance(g, Record) for g in got)
    assert [g.data for g in got if isinstance(g, Record)] == records


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2 * BLOCK_SIZE), min_size=1, max_size=8), st.data())
def test_any_cut_recovers_exactly_the_complete_records(
    sizes: list[int], data: st.DataObject
) -> None:
    """Point-in-time after a cut anywhere (even inside a trailer): every record
    ending before the cut and no more; the next append follows them."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        entries = [(i + 1, payload(i + 1, n)) for i, n in enumerate(sizes)]
        path, _ = write_segment(d, entries)
        with open(path, "rb") as f:
            ends = [r.end for r in LogReader(f, str(path)) if isinstance(r, Record)]
        cut = data.draw(st.integers(0, path.stat().st_size))
        truncate_file(path, cut)
        complete = [lsn for (lsn, _), end in zip(entries, ends, strict=True) if end <= cut]
        last = complete[-1] if complete else 0
        driver = FileDriver(d)
        assert driver.last_lsn() == last
        assert driver.recovery.skipped == []
        assert driver.append(last + 1, b"next").result(timeout=10) == last + 1
        driver.close()
        driver = FileDriver(d, recovery_mode="absolute-consistency")
        got = [(r.lsn, r.payload) for r in LogStore(driver).records()]
        driver.close()
        assert got == [e for e in entries if e[0] <= last] + [(last + 1, b"next")]


def test_entry_prefix() -> None:
    assert decode_lsn(encode_entry(2**40 + 3, b"p")) == 2**40 + 3
