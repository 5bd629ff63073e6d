"""Building segment files byte by byte, and damaging them, for the file-backend tests."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c

from tn.logstore.file_backend.format import (
    BLOCK_SIZE,
    HEADER,
    HEADER_SIZE,
    LSN_SIZE,
    encode_entry,
    mask,
)
from tn.logstore.file_backend.segments import segment_name
from tn.logstore.file_backend.writer import LogWriter


def payload(lsn: int, size: int) -> bytes:
    """A payload whose bytes depend on its LSN, so misplaced data is caught."""
    unit = b"%d;" % lsn
    return (unit * (size // len(unit) + 1))[:size]


def fill_block(lsn: int) -> bytes:
    """A payload whose record fills exactly one whole block (one FULL record)."""
    return payload(lsn, BLOCK_SIZE - HEADER_SIZE - LSN_SIZE)


def write_segment(
    directory: Path, entries: list[tuple[int, bytes]], first_lsn: int | None = None
) -> tuple[Path, list[int]]:
    """Write `entries` as one segment; return its path and each record's start offset."""
    directory.mkdir(parents=True, exist_ok=True)
    first = first_lsn if first_lsn is not None else (entries[0][0] if entries else 1)
    path = directory / segment_name(first)
    writer = LogWriter()
    out = bytearray()
    offsets: list[int] = []
    for lsn, data in entries:
        off = len(out)
        if BLOCK_SIZE - off % BLOCK_SIZE < HEADER_SIZE:
            off += BLOCK_SIZE - off % BLOCK_SIZE
        offsets.append(off)
        writer.add_record(encode_entry(lsn, data), out)
    path.write_bytes(bytes(out))
    return path, offsets


def header_at(path: Path, offset: int) -> tuple[int, int, int]:
    with open(path, "rb") as f:
        f.seek(offset)
        crc, length, rtype = HEADER.unpack(f.read(HEADER_SIZE))
    return int(crc), int(length), int(rtype)


def poke(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


def set_type(path: Path, offset: int, rtype: int) -> None:
    """Rewrite a physical record's type and fix its crc (a 'valid' wrong type)."""
    _, length, _ = header_at(path, offset)
    with open(path, "r+b") as f:
        f.seek(offset + HEADER_SIZE)
        data = f.read(length)
        f.seek(offset)
        crc = mask(crc32c.crc32c(bytes([rtype]) + data))  # any type, even unknown ones
        f.write(HEADER.pack(crc, length, rtype))


def increment_length(path: Path, offset: int) -> None:
    _, length, _ = header_at(path, offset)
    poke(path, offset + 4, struct.pack("<H", length + 1))


def truncate_file(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def crash_size(lsn: int) -> int:
    """The payload size of entry `lsn` in the crash test: mostly small, a few
    spanning several blocks."""
    if lsn % 97 == 0:
        return 40_000 + (lsn * 7919) % 60_000
    return (lsn * 2654435761) % 1500
