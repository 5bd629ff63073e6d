"""Record header names of the WAL topic, and the framing of entries in a record value.

Every record on the WAL topic is one of two kinds (header `kwal.kind`):

- `entries`: a group of consecutive logical entries. Headers: `kwal.epoch`
  (writer epoch), `kwal.first` (first logical LSN), `kwal.count` (number of
  entries), `kwal.acked` (the writer's contiguous acknowledged LSN when it
  issued the record) and `kwal.writer` (the writer's id). The value is the
  entries framed as `u32 big-endian length | payload`, repeated `count` times.
- `epoch`: the marker a starting writer puts on every partition (value empty).
  It fences older epochs in that partition and marks the end of the log for
  that writer's replay.

Integers are 8-byte big-endian signed.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

H_KIND = "kwal.kind"
H_EPOCH = "kwal.epoch"
H_FIRST = "kwal.first"
H_COUNT = "kwal.count"
H_ACKED = "kwal.acked"
H_WRITER = "kwal.writer"

KIND_ENTRIES = b"entries"
KIND_EPOCH = b"epoch"

_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")

Headers = list[tuple[str, str | bytes | None]]


class HeaderError(ValueError):
    """A WAL record's headers are missing or malformed."""


@dataclass(frozen=True, slots=True)
class RecordHeader:
    """The decoded headers of one WAL record."""

    kind: bytes
    epoch: int
    first: int = 0
    count: int = 0
    acked: int = 0
    writer: str = ""

    @property
    def last(self) -> int:
        """The last logical LSN held (first - 1 when the record holds none)."""
        return self.first + self.count - 1


def _i64(value: int) -> bytes:
    return _I64.pack(value)


def entries_headers(epoch: int, first: int, count: int, acked: int, writer: str) -> Headers:
    return [
        (H_KIND, KIND_ENTRIES),
        (H_EPOCH, _i64(epoch)),
        (H_FIRST, _i64(first)),
        (H_COUNT, _i64(count)),
        (H_ACKED, _i64(acked)),
        (H_WRITER, writer.encode()),
    ]


def epoch_headers(epoch: int, writer: str) -> Headers:
    return [(H_KIND, KIND_EPOCH), (H_EPOCH, _i64(epoch)), (H_WRITER, writer.encode())]


def decode_headers(headers: Any) -> RecordHeader:
    """Decode a WAL record's headers; `HeaderError` when they are not kwal's."""
    pairs = headers.items() if isinstance(headers, dict) else (headers or [])
    found: dict[str, bytes] = {
        k: (v.encode() if isinstance(v, str) else v) for k, v in pairs if v is not None
    }
    try:
        kind = found[H_KIND]
        epoch = _I64.unpack(found[H_EPOCH])[0]
        writer = found.get(H_WRITER, b"").decode()
        if kind == KIND_EPOCH:
            return RecordHeader(kind, epoch, writer=writer)
        if kind != KIND_ENTRIES:
            raise HeaderError(f"unknown record kind {kind!r}")
        return RecordHeader(
            kind,
            epoch,
            _I64.unpack(found[H_FIRST])[0],
            _I64.unpack(found[H_COUNT])[0],
            _I64.unpack(found[H_ACKED])[0],
            writer,
        )
    except (KeyError, struct.error, UnicodeDecodeError) as e:
        raise HeaderError(f"not a kwal WAL record: {e!r}") from e


def encode_entries(payloads: Sequence[bytes]) -> bytes:
    """Frame payloads as `u32 length | bytes` each."""
    parts: list[bytes] = []
    for p in payloads:
        parts.append(_U32.pack(len(p)))
        parts.append(p)
    return b"".join(parts)


def decode_entries(value: bytes, count: int) -> list[bytes]:
    """Split a record value into its `count` payloads; `HeaderError` when it does not add up."""
    out: list[bytes] = []
    pos = 0
    view = memoryview(value)
    for _ in range(count):
        if pos + 4 > len(value):
            raise HeaderError("record value shorter than its entry count")
        (n,) = _U32.unpack_from(value, pos)
        pos += 4
        if pos + n > len(value):
            raise HeaderError("entry runs past the record value")
        out.append(bytes(view[pos : pos + n]))
        pos += n
    if pos != len(value):
        raise HeaderError("trailing bytes after the last entry")
    return out


FRAME_OVERHEAD = _U32.size
