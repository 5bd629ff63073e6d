"""Avro's binary encoding of the primitive values, written and read by hand.

Why: fastavro's generic writer and reader walk the schema for every record, which was
~20% of a client's CPU per one-row commit (docs/perf-commit.md, "2026-11-27 (5)") and
a third of the TN's request loop (its decoding of each request, "2026-11-27 (9)").
`schemas.requests` writes and reads the common request and the result records with
these instead, on both sides; the bytes are fastavro's own
(tests/schemas/test_requests_avro.py compares them), and anything these do not cover
goes through the codec as before.

The encoding (Avro 1.11 specification, "Binary Encoding"):

- int/long: zig-zag, then a little-endian base-128 varint (7 bits a byte, high bit set
  on every byte but the last);
- string/bytes: the length as a long, then the bytes (a string's in UTF-8);
- enum: the symbol's index as an int; union: the branch's index as a long, then the value;
- array: blocks of (count as a long, the items), ended by a zero count (fastavro writes
  a non-empty array as one block).
"""

from __future__ import annotations

ARRAY_END = b"\x00"  # an array's closing empty block (a count of 0)
# What a hand-written writer gives up on, for the codec to write the value or say what is
# wrong with it: a value of another type, a missing field, a number beyond a long, a
# string that is not UTF-8 (UnicodeEncodeError is a ValueError).
UNFIT = (TypeError, AttributeError, KeyError, ValueError, OverflowError)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
# the one-byte encodings: longs -64..63 (zig-zag 0..127)
_SMALL = [bytes((z,)) for z in range(128)]


def long_bytes(n: int) -> bytes:
    """`n` as an Avro long. OverflowError outside int64 (fastavro's writer refuses those too)."""
    if not _INT64_MIN <= n <= _INT64_MAX:
        raise OverflowError(f"{n} does not fit an Avro long")
    z = (n << 1) ^ (n >> 63)
    if z < 0x80:
        return _SMALL[z]
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def bytes_bytes(b: bytes) -> bytes:
    """`b` as Avro bytes (length, then the bytes)."""
    return long_bytes(len(b)) + b


def optional_bytes(b: bytes | None) -> bytes:
    """`b` as a ``["null", "bytes"]`` union: branch 0 for None, else branch 1 and the bytes."""
    return b"\x00" if b is None else b"\x02" + long_bytes(len(b)) + b


def str_bytes(s: str) -> bytes:
    """`s` as an Avro string (UnicodeEncodeError for a lone surrogate, as fastavro's)."""
    return bytes_bytes(s.encode("utf-8"))


def read_long(data: bytes, pos: int) -> tuple[int, int]:
    """The long at `pos`, and where the next value starts. IndexError when `data` ends
    inside it; ValueError for a varint longer than a long's ten bytes."""
    b = data[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    z = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = data[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            if z >> 64:  # bits past a long's 64 (fastavro's reader drops them)
                raise ValueError("varint wider than a long")
            return (z >> 1) ^ -(z & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than a long")


def read_bytes(data: bytes, pos: int) -> tuple[bytes, int]:
    """The bytes value at `pos`, and where the next value starts (ValueError: a negative
    length, or bytes past the end)."""
    n, pos = read_long(data, pos)
    end = pos + n
    if n < 0 or end > len(data):
        raise ValueError(f"{n} bytes at {pos} in {len(data)} bytes")
    return data[pos:end], end


def read_str(data: bytes, pos: int) -> tuple[str, int]:
    """The string at `pos`, and where the next value starts (ValueError: a negative
    length, or bytes past the end or not UTF-8)."""
    n = data[pos]
    if n < 0x80 and not n & 1:  # a length of 0..63 is one byte: no call for it
        n >>= 1
        pos += 1
    else:
        n, pos = read_long(data, pos)
    end = pos + n
    if n < 0 or end > len(data):
        raise ValueError(f"string of {n} bytes at {pos} in {len(data)} bytes")
    return data[pos:end].decode("utf-8"), end


def read_count(data: bytes, pos: int) -> tuple[int, int]:
    """An array block's item count at `pos` (0: the array's end), and where its items
    start. A negative count is followed by the block's size in bytes, which is skipped
    (writers may give it; fastavro reads it)."""
    count, pos = read_long(data, pos)
    if count < 0:
        _, pos = read_long(data, pos)
        return -count, pos
    return count, pos


def read_optional_bytes(data: bytes, pos: int) -> tuple[bytes | None, int]:
    """A ``["null", "bytes"]`` union's value at `pos` (ValueError: another branch)."""
    branch = data[pos]
    if branch == 0:
        return None, pos + 1
    if branch != 2:  # zig-zag 1: the bytes branch
        raise ValueError(f"union branch {branch}")
    return read_bytes(data, pos + 1)
