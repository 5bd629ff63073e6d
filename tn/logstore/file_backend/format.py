"""The on-disk format of a segment file: leveldb's log format, unchanged.

A segment is a sequence of 32 KiB blocks. Each block holds physical records;
a physical record never crosses a block boundary::

      block 0                          block 1
    +--------+------+--------+--------+--------+---------------+--------+
    | header | data | header |  data  | header |      data     | header | ...
    +--------+------+--------+--------+--------+---------------+--------+
    |<------------------ 32768 ------------------>|
    A block whose last < 7 bytes cannot hold a header ends in zero padding
    (the "trailer"); the reader skips it.

Physical record (little-endian)::

    +-------------------+-------------+-----------+---------------------+
    | masked crc (4 B)  | length (2 B)| type (1 B)| data (length bytes) |
    +-------------------+-------------+-----------+---------------------+
    crc = mask(crc32c(type byte + data))

Record types:

    ZERO   = 0  reserved (preallocated or zero-filled space); never written
    FULL   = 1  the whole logical record
    FIRST  = 2  first fragment of a logical record
    MIDDLE = 3  interior fragment
    LAST   = 4  last fragment

A logical record that does not fit in the rest of a block is split:
FIRST, then MIDDLE for each whole block it fills, then LAST.

Logical record of kwal (what the driver stores)::

    +----------------+------------------------+
    | LSN (8 B, LE)  | payload (opaque bytes) |
    +----------------+------------------------+

The mask (leveldb's ``crc32c::Mask``) rotates the crc right by 15 bits and
adds a constant, so that computing the crc of data that itself embeds crcs
does not degenerate.
"""

from __future__ import annotations

import struct
from enum import IntEnum

import crc32c

BLOCK_SIZE = 32768
HEADER_SIZE = 4 + 2 + 1
LSN_SIZE = 8
MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF

HEADER = struct.Struct("<IHB")
LSN = struct.Struct("<Q")


class RecordType(IntEnum):
    ZERO = 0
    FULL = 1
    FIRST = 2
    MIDDLE = 3
    LAST = 4


MAX_RECORD_TYPE = int(RecordType.LAST)

# crc32c of the one type byte, per type: a physical record's crc extends it.
TYPE_CRC: tuple[int, ...] = tuple(crc32c.crc32c(bytes([t])) for t in range(MAX_RECORD_TYPE + 1))


def mask(crc: int) -> int:
    """leveldb's Mask: rotate right 15 and add a constant (mod 2^32)."""
    return ((((crc >> 15) | (crc << 17)) & _U32) + MASK_DELTA) & _U32


def unmask(masked: int) -> int:
    """Inverse of `mask`."""
    rot = (masked - MASK_DELTA) & _U32
    return ((rot >> 17) | (rot << 15)) & _U32


def record_crc(record_type: int, data: bytes | memoryview) -> int:
    """The masked crc stored in a physical record's header."""
    return mask(crc32c.crc32c(data, TYPE_CRC[record_type]))


def encode_header(record_type: int, data: bytes | memoryview) -> bytes:
    return HEADER.pack(record_crc(record_type, data), len(data), record_type)


def encode_entry(lsn: int, payload: bytes) -> bytes:
    """The logical record for one log entry: LSN prefix + payload."""
    return LSN.pack(lsn) + payload


def decode_lsn(record: bytes) -> int:
    return int(LSN.unpack_from(record)[0])
