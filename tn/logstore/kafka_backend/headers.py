"""Record header names of the WAL topic, and the framing of entries in a record value.

Every record on the WAL topic is one of two kinds (header `kwal.kind`):

- `entries`: a group of consecutive logical entries. Headers: `kwal.epoch`
  (writer epoch), `kwal.first` (first logical LSN), `kwal.count` (number of
  entries), `kwal.acked` (the writer's contiguous acknowledged LSN when it
  issued the record), `kwal.writer` (the writer's id) and `kwal.version` (the
  record format, `schemas.wal_record`; absent in records written before it
  existed, which are version 1: the entries framed as `u32 big-endian length |
  payload`, repeated `count` times; version 2: one columnar `wal_group` record;
  version 3: one `wal_group3` record, its one-block appends as int64 columns).
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

from schemas.exceptions import DecodeError
from schemas.wal_record import (
    RECORD_V1,
    RECORD_V2,
    RECORD_V3,
    check_version,
    decode_v1,
    encode_v1,
    encode_v2,
    encode_v3,
    entries_of,
    lazy_payloads,
)

H_KIND = "kwal.kind"
H_EPOCH = "kwal.epoch"
H_FIRST = "kwal.first"
H_COUNT = "kwal.count"
H_ACKED = "kwal.acked"
H_WRITER = "kwal.writer"
H_VERSION = "kwal.version"

KIND_ENTRIES = b"entries"
KIND_EPOCH = b"epoch"

_I64 = struct.Struct(">q")

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
    version: int = RECORD_V1  # the value's format (`schemas.wal_record`)

    @property
    def last(self) -> int:
        """The last logical LSN held (first - 1 when the record holds none)."""
        return self.first + self.count - 1


def _i64(value: int) -> bytes:
    return _I64.pack(value)


def entries_headers(
    epoch: int, first: int, count: int, acked: int, writer: str, version: int = RECORD_V1
) -> Headers:
    """An `entries` record's headers. Version 1 records carry no `kwal.version` header,
    byte for byte as written before version 2 existed."""
    headers: Headers = [
        (H_KIND, KIND_ENTRIES),
        (H_EPOCH, _i64(epoch)),
        (H_FIRST, _i64(first)),
        (H_COUNT, _i64(count)),
        (H_ACKED, _i64(acked)),
        (H_WRITER, writer.encode()),
    ]
    if version != RECORD_V1:
        headers.append((H_VERSION, _i64(version)))
    return headers


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
        version = found.get(H_VERSION)
        return RecordHeader(
            kind,
            epoch,
            _I64.unpack(found[H_FIRST])[0],
            _I64.unpack(found[H_COUNT])[0],
            _I64.unpack(found[H_ACKED])[0],
            writer,
            RECORD_V1 if version is None else _I64.unpack(version)[0],
        )
    except (KeyError, struct.error, UnicodeDecodeError) as e:
        raise HeaderError(f"not a kwal WAL record: {e!r}") from e


def encode_entries(payloads: Sequence[bytes]) -> bytes:
    """Frame payloads as `u32 length | bytes` each (record version 1)."""
    return encode_v1(payloads)


def decode_entries(value: bytes, count: int) -> list[bytes]:
    """Split a version 1 record value into its `count` payloads; `HeaderError` when it
    does not add up."""
    try:
        return decode_v1(value, count)
    except DecodeError as e:
        raise HeaderError(str(e)) from e


def encode_value(payloads: Sequence[bytes], version: int, first: int) -> tuple[bytes, int]:
    """A record value for `payloads` (at LSNs `first`, ...) and the version it is in:
    version 2 or 3 when asked and every payload is a WAL entry (`EncodedEntry`), else 1."""
    if version in (RECORD_V2, RECORD_V3):
        entries = entries_of(payloads)
        if entries is not None:
            encode = encode_v3 if version == RECORD_V3 else encode_v2
            return encode(entries, first), version
    return encode_v1(payloads), RECORD_V1


def decode_value(
    header: RecordHeader, value: bytes, where: str, shared: bool = False
) -> tuple[bytes, ...]:
    """The payloads of an `entries` record of any version (`where` names the record in
    errors). An unknown version raises `UnsupportedFormatError`, a garbled value
    `DecodeError`, both naming the version and `where`: never skipped as foreign.
    Version 2 and 3 entries are decoded when first used (`schemas.wal_record.LazyEntry`),
    so a garbled body surfaces then. `shared`: a version 2 or 3 record's payloads are its
    one `LazyGroup` (`schemas.wal_record.payload_at` gives each entry's own)."""
    if not header.count:
        return ()
    check_version(header.version, where)
    if header.version in (RECORD_V2, RECORD_V3):
        return tuple(
            lazy_payloads(value, header.first, header.count, where, header.version, shared)
        )
    return tuple(decode_v1(value, header.count, where))
