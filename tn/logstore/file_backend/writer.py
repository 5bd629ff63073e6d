"""leveldb's log writer: logical records in, block-framed physical records out.

The writer only encodes: it appends bytes to a buffer the caller writes (one
write and one sync per group, see `driver`). Protocol of `add_record`
(leveldb ``Writer::AddRecord``):

1. ``left`` = bytes of the logical record still to emit; ``begin`` = True.
2. If the current block has fewer than 7 bytes left, fill them with zeros
   (the trailer) and start a new block.
3. The fragment is ``min(left, block space after a header)`` bytes
   (possibly 0 when exactly a header fits: leveldb emits an empty FIRST).
4. Its type is FULL (begin and end), FIRST (begin), LAST (end) or MIDDLE.
5. Emit header + fragment; advance; repeat from 2 while ``left > 0``.
"""

from __future__ import annotations

import crc32c

from tn.logstore.file_backend.format import (
    BLOCK_SIZE,
    HEADER,
    HEADER_SIZE,
    MASK_DELTA,
    TYPE_CRC,
    RecordType,
    record_crc,
)

_ZEROS = bytes(HEADER_SIZE)
_FULL = int(RecordType.FULL)
_FULL_CRC = TYPE_CRC[_FULL]
_U32 = 0xFFFFFFFF
_crc32c = crc32c.crc32c
_pack_header = HEADER.pack


class LogWriter:
    """Frames logical records into a buffer; tracks the offset within the block."""

    __slots__ = ("_block_offset",)

    def __init__(self, file_size: int = 0) -> None:
        """`file_size`: bytes already in the file this writer appends to."""
        self._block_offset = file_size % BLOCK_SIZE

    @property
    def block_offset(self) -> int:
        return self._block_offset

    def add_record(self, data: bytes, out: bytearray) -> None:
        """Append the physical records of one logical record to `out`."""
        left = len(data)
        offset = self._block_offset
        # Fast path: the whole record fits in the current block (FULL). Written out
        # (record_crc and mask inlined): it runs once per entry on the writer thread.
        if BLOCK_SIZE - offset >= HEADER_SIZE + left:
            crc = _crc32c(data, _FULL_CRC)
            masked = ((((crc >> 15) | (crc << 17)) & _U32) + MASK_DELTA) & _U32
            out += _pack_header(masked, left, _FULL)
            out += data
            self._block_offset = offset + HEADER_SIZE + left
            return
        view = memoryview(data)
        pos = 0
        begin = True
        while True:
            leftover = BLOCK_SIZE - self._block_offset
            if leftover < HEADER_SIZE:  # step 2: trailer
                out += _ZEROS[:leftover]
                self._block_offset = 0
            avail = BLOCK_SIZE - self._block_offset - HEADER_SIZE
            fragment = min(left, avail)  # step 3
            end = left == fragment
            if begin and end:  # step 4
                rtype = RecordType.FULL
            elif begin:
                rtype = RecordType.FIRST
            elif end:
                rtype = RecordType.LAST
            else:
                rtype = RecordType.MIDDLE
            chunk = view[pos : pos + fragment]
            out += HEADER.pack(record_crc(rtype, chunk), fragment, rtype)  # step 5
            out += chunk
            self._block_offset += HEADER_SIZE + fragment
            pos += fragment
            left -= fragment
            begin = False
            if left <= 0:
                return
