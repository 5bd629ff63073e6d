"""Segment files, their in-memory index, and the durable truncation point.

Directory layout::

    <dir>/00000000000000000001.log   segment whose first record has LSN 1
    <dir>/00000000000000004097.log   the next segment (rolled at segment_bytes)
    <dir>/TRUNCATED                  durable truncation point (see below)
    <dir>/*.log.dropped              segments recovery set aside (never read)

A segment is named by the LSN of its first record (20 digits, so names sort
as numbers); it rolls once its size reaches the limit, always at a record
boundary, after the previous segment was synced. Past its last record a
segment may hold zeros the writer preallocated; zeros up to EOF are the end.

TRUNCATED holds ``LSN (8 B, LE) | masked crc32c of those 8 bytes (4 B)``.
Writing it:

1. write TRUNCATED.tmp, fsync it;
2. rename it over TRUNCATED (atomic);
3. fsync the directory (the rename is durable);
4. only then delete the segments whose records are all <= the point.
"""

from __future__ import annotations

import bisect
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from tn.logstore.file_backend.exceptions import RecoveryError
from tn.logstore.file_backend.format import mask

SEGMENT_SUFFIX = ".log"
DROPPED_SUFFIX = ".dropped"
TRUNCATION_FILE = "TRUNCATED"
INDEX_SPACING = 64 << 10  # one index point per this many bytes of a segment
_SEGMENT_RE = re.compile(r"^(\d{20})\.log$")
_POINT = struct.Struct("<QI")


def segment_name(first_lsn: int) -> str:
    return f"{first_lsn:020d}{SEGMENT_SUFFIX}"


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """(first LSN, path) of every segment file, in LSN order."""
    out: list[tuple[int, Path]] = []
    if not directory.is_dir():
        return out
    for entry in directory.iterdir():
        m = _SEGMENT_RE.match(entry.name)
        if m:
            out.append((int(m.group(1)), entry))
    out.sort()
    return out


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_data(fd: int) -> None:
    """fdatasync where the platform has it (data and size, not timestamps)."""
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:  # pragma: no cover - macOS/Windows
        os.fsync(fd)


def create_segment(directory: Path, first_lsn: int) -> tuple[Path, int]:
    """Create an empty segment, make its name durable, return (path, fd for pwrite)."""
    path = directory / segment_name(first_lsn)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    fsync_dir(directory)
    return path, fd


def read_truncation_point(directory: Path) -> int:
    path = directory / TRUNCATION_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return 0
    if len(raw) != _POINT.size:
        raise RecoveryError(
            f"{path} at offset 0: {len(raw)} bytes, expected {_POINT.size}", str(path)
        )
    lsn, crc = _POINT.unpack(raw)
    if mask(crc32c.crc32c(raw[:8])) != crc:
        raise RecoveryError(f"{path} at offset 0: checksum mismatch", str(path))
    return int(lsn)


def write_truncation_point(directory: Path, lsn: int) -> None:
    """Steps 1-3 of the module docstring."""
    tmp = directory / (TRUNCATION_FILE + ".tmp")
    lsn_bytes = struct.pack("<Q", lsn)
    data = lsn_bytes + struct.pack("<I", mask(crc32c.crc32c(lsn_bytes)))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / TRUNCATION_FILE)
    fsync_dir(directory)


@dataclass
class Segment:
    """What the driver knows of one segment: its valid size and a sparse LSN index."""

    first_lsn: int
    path: Path
    size: int = 0  # bytes of valid (durable) records
    last_lsn: int = 0  # 0 while the segment holds no record
    index_lsns: list[int] = field(default_factory=list)
    index_offsets: list[int] = field(default_factory=list)

    def note(self, lsn: int, offset: int) -> None:
        """Remember that a record with `lsn` starts at `offset` (sparsely)."""
        if not self.index_offsets or offset - self.index_offsets[-1] >= INDEX_SPACING:
            self.index_lsns.append(lsn)
            self.index_offsets.append(offset)

    def seek(self, lsn: int) -> int:
        """An offset at a record boundary at or before the record with `lsn`."""
        i = bisect.bisect_right(self.index_lsns, lsn) - 1
        return self.index_offsets[i] if i >= 0 else 0
