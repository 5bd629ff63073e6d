"""leveldb's log reader, with every kind of damage named in `DamageKind`.

The reader turns a segment file back into logical records. It never decides
what damage *means* (that is the recovery mode's job, `recovery.policy`); it
names each damage, says where it is and how many bytes it covers, and resumes
where leveldb resumes.

Protocol of one physical record (`LogReader._physical`), at file offset `off`:

1. If the block has fewer than 7 bytes left, skip them (the trailer).
2. If fewer than 7 bytes of the block exist before EOF: TORN_HEADER (tail).
3. An all-zero header: when zeros run to EOF this is the clean end of the
   log (the writer preallocates segments with zeros, as leveldb skips the
   zeros of an mmap-preallocated file); else ZERO_FILL, drop the rest of the
   block.
4. If header + length runs past the bytes present in the block: at EOF,
   TORN_PAYLOAD (tail); else BAD_LENGTH, drop the rest of the block.
5. crc mismatch: BAD_CRC, drop the rest of the block (the length itself may
   be the corrupt field). It counts as at EOF when only zeros follow the
   record it claims to be: a torn write of the last record.
6. type not FULL/FIRST/MIDDLE/LAST: BAD_TYPE, skip just this record (its
   crc was valid, so its length is to be trusted).

Protocol of one logical record (`LogReader.__iter__`):

1. FULL: a record (a pending FIRST... is MISSING_LAST).
2. FIRST: start assembling (a pending FIRST... is MISSING_LAST).
3. MIDDLE: append, or UNEXPECTED_MIDDLE with nothing pending.
4. LAST: append and emit, or UNEXPECTED_LAST with nothing pending.
5. Physical damage while assembling drops the partial record
   (MISSING_LAST); a torn tail while assembling, or EOF while assembling,
   is one TORN_RECORD from the FIRST to EOF.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import BinaryIO

import crc32c

from tn.logstore.file_backend.format import (
    BLOCK_SIZE,
    HEADER,
    HEADER_SIZE,
    MAX_RECORD_TYPE,
    RecordType,
    mask,
)

_CHUNK = 1 << 20


class DamageKind(Enum):
    """Every way a segment can be damaged, the one list of them. `TAIL_KINDS`
    are what a crash in the middle of a write leaves at the end of a file;
    `Damage.at_eof` says whether only zeros or EOF follow."""

    TORN_HEADER = "torn header at end of file"
    TORN_PAYLOAD = "torn payload at end of file"
    TORN_RECORD = "fragmented record cut off at end of file (FIRST without LAST)"
    ZERO_FILL = "zero-filled space"
    BAD_CRC = "checksum mismatch"
    BAD_LENGTH = "bad record length"
    BAD_TYPE = "unknown record type"
    UNEXPECTED_MIDDLE = "MIDDLE fragment without a FIRST"
    UNEXPECTED_LAST = "LAST fragment without a FIRST"
    MISSING_LAST = "partial record without end (FIRST without LAST)"
    # Logical checks, made by recovery on records the reader returned:
    SHORT_RECORD = "record shorter than its 8-byte LSN"
    LSN_GAP = "LSN gap"
    LSN_REGRESSION = "LSN not above its predecessor"


TAIL_KINDS = frozenset(
    {
        DamageKind.TORN_HEADER,
        DamageKind.TORN_PAYLOAD,
        DamageKind.TORN_RECORD,
        DamageKind.BAD_CRC,
    }
)


@dataclass(frozen=True, slots=True)
class Damage:
    kind: DamageKind
    path: str
    offset: int
    size: int
    at_eof: bool  # the damaged bytes run to the end of the file
    detail: str = ""

    def __str__(self) -> str:
        extra = f": {self.detail}" if self.detail else ""
        return f"{self.path} at offset {self.offset}: {self.kind.value} ({self.size} bytes){extra}"


@dataclass(frozen=True, slots=True)
class Record:
    """A logical record: its data and the file range [offset, end) it came from."""

    offset: int
    end: int
    data: bytes


class LogReader:
    """Reads logical records of one file from `start` (a record boundary) to `limit`."""

    def __init__(
        self, f: BinaryIO, path: str, start: int = 0, limit: int | None = None, chunk: int = _CHUNK
    ) -> None:
        self._f = f
        self._path = path
        if limit is None:
            limit = f.seek(0, 2)
        self._limit = limit
        self._chunk = max(BLOCK_SIZE, chunk)
        self._buf = b""
        self._buf_start = start
        self._pos = start

    @property
    def position(self) -> int:
        return self._pos

    def _ensure(self, off: int, n: int) -> int:
        """Buffer [off, off+n) (clipped at the limit); return how many bytes exist."""
        n = min(n, self._limit - off)
        if self._buf_start <= off and off + n <= self._buf_start + len(self._buf):
            return n
        self._f.seek(off)
        self._buf = self._f.read(min(max(n, self._chunk), self._limit - off))
        self._buf_start = off
        return min(n, len(self._buf))

    def _damage(self, kind: DamageKind, off: int, size: int, detail: str = "") -> Damage:
        return Damage(kind, self._path, off, size, off + size >= self._limit, detail)

    def _zeros_to_eof(self, off: int) -> bool:
        pos = off
        while pos < self._limit:
            self._f.seek(pos)
            chunk = self._f.read(min(_CHUNK, self._limit - pos))
            if not chunk:
                break
            if chunk.count(0) != len(chunk):
                return False
            pos += len(chunk)
        return True

    def _physical(self) -> tuple[int, int, bytes] | Damage | None:
        """The next physical record as (type, offset, data), a Damage, or None at EOF."""
        while True:
            off = self._pos
            if off >= self._limit:
                return None
            block_left = BLOCK_SIZE - off % BLOCK_SIZE
            if block_left < HEADER_SIZE:  # step 1: trailer
                self._pos = off + block_left
                continue
            have = self._ensure(off, block_left)
            if have < HEADER_SIZE:  # step 2
                self._pos = self._limit
                return self._damage(DamageKind.TORN_HEADER, off, have)
            buf = self._buf
            i = off - self._buf_start
            crc, length, rtype = HEADER.unpack_from(buf, i)
            if crc == 0 and length == 0 and rtype == 0:  # step 3
                if self._zeros_to_eof(off):
                    self._pos = self._limit
                    return None
                self._pos = off + block_left
                return self._damage(DamageKind.ZERO_FILL, off, have)
            if HEADER_SIZE + length > have:  # step 4
                if have < block_left:
                    self._pos = self._limit
                    return self._damage(
                        DamageKind.TORN_PAYLOAD,
                        off,
                        have,
                        f"length {length}, {have - HEADER_SIZE} present",
                    )
                self._pos = off + block_left
                return self._damage(
                    DamageKind.BAD_LENGTH, off, block_left, f"length {length} past the block end"
                )
            end = i + HEADER_SIZE + length
            if mask(crc32c.crc32c(memoryview(buf)[i + HEADER_SIZE - 1 : end])) != crc:  # step 5
                self._pos = off + block_left
                claimed_end = off + HEADER_SIZE + length
                return Damage(
                    DamageKind.BAD_CRC, self._path, off, have, self._zeros_to_eof(claimed_end)
                )
            self._pos = off + HEADER_SIZE + length
            if rtype == 0 or rtype > MAX_RECORD_TYPE:  # step 6
                return self._damage(DamageKind.BAD_TYPE, off, HEADER_SIZE + length, f"type {rtype}")
            return rtype, off, buf[i + HEADER_SIZE : end]

    def __iter__(self) -> Iterator[Record | Damage]:
        frag_start = -1
        parts: list[bytes] = []
        while True:
            p = self._physical()
            if p is None:
                if frag_start >= 0:  # step 5: EOF while assembling
                    yield self._damage(DamageKind.TORN_RECORD, frag_start, self._limit - frag_start)
                return
            if isinstance(p, Damage):
                if frag_start >= 0:  # step 5
                    if p.at_eof and p.kind in TAIL_KINDS:
                        yield self._damage(
                            DamageKind.TORN_RECORD, frag_start, self._limit - frag_start
                        )
                        return
                    yield self._damage(DamageKind.MISSING_LAST, frag_start, p.offset - frag_start)
                    frag_start, parts = -1, []
                yield p
                continue
            rtype, off, data = p
            if rtype == RecordType.FULL:  # step 1
                if frag_start >= 0:
                    yield self._damage(DamageKind.MISSING_LAST, frag_start, off - frag_start)
                    frag_start, parts = -1, []
                yield Record(off, self._pos, data)
            elif rtype == RecordType.FIRST:  # step 2
                if frag_start >= 0:
                    yield self._damage(DamageKind.MISSING_LAST, frag_start, off - frag_start)
                frag_start, parts = off, [data]
            elif rtype == RecordType.MIDDLE:  # step 3
                if frag_start < 0:
                    yield self._damage(DamageKind.UNEXPECTED_MIDDLE, off, self._pos - off)
                else:
                    parts.append(data)
            else:  # step 4: LAST
                if frag_start < 0:
                    yield self._damage(DamageKind.UNEXPECTED_LAST, off, self._pos - off)
                else:
                    parts.append(data)
                    yield Record(frag_start, self._pos, b"".join(parts))
                    frag_start, parts = -1, []
