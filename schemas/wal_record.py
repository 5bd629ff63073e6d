"""The value of a WAL record (FORMAT.md §8), both versions the Kafka WAL has written.

A WAL record holds a group of consecutive entries; its headers say how many
(`kwal.count`), from which LSN (`kwal.first`) and, since version 2, in which
format (`kwal.version`; absent means 1):

- **version 1** (`encode_v1` / `decode_v1`): `count` frames of
  ``u32 big-endian length | payload``, each payload one ``wal_entry`` record in
  the kwal envelope, carrying its rows as its own Arrow IPC stream. Decoding a
  record is one Avro and one Arrow decode per entry. Still read; still written
  for payloads that are not WAL entries (a log of opaque bytes).
- **version 2** (`encode_v2` / `decode_v2`): one ``wal_group`` record in the kwal
  envelope: the entries' metadata (LSN, timestamps, commands) in one Avro body,
  and their rows as columns: one Arrow IPC stream per table schema in the group,
  each ONE record batch holding the rows of every entry of that schema, in entry
  order. An ``Append`` names its batch by index and where its rows start in it
  (``row_base``). Decoding a record is one Avro decode and one Arrow decode per
  schema; the decoded entries' Appends share the group's batch (their
  ``src_offset`` counts from its first row), so replay reads columns once per
  record, not once per entry.

The entries decoded from either version are the same `WalEntry` values, up to
that sharing of a batch (and its offsets).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from schemas.arrow_ipc import ipc_to_table, join_stream, split_stream, table_to_ipc
from schemas.codec import (
    EncodedEntry,
    command_in,
    decode_record,
    encode_record,
    entry_to_record,
    schema_of,
)
from schemas.exceptions import CodecError, DecodeError, UnsupportedFormatError
from schemas.wal import Append, AppendInfo, Dest, TxnContext, WalEntry

RECORD_V1 = 1
RECORD_V2 = 2
RECORD_VERSIONS = frozenset({RECORD_V1, RECORD_V2})
WAL_GROUP = "wal_group"

_U32 = struct.Struct(">I")
FRAME_OVERHEAD = _U32.size

_V1_NS, _V2_NS = "kwal.wal.", "kwal.wal2."
_APPEND_V1 = _V1_NS + "Append"
_APPEND_V2 = _V2_NS + "Append"


def check_version(version: int, where: str) -> None:
    """Refuse a record format this reader does not know, naming it and the record."""
    if version not in RECORD_VERSIONS:
        raise UnsupportedFormatError(
            f"WAL record {where} has format version {version}; this reader supports "
            f"version(s) {', '.join(map(str, sorted(RECORD_VERSIONS)))} (written by a newer kwal?)"
        )


# --- version 1 ----------------------------------------------------------------------------


def encode_v1(payloads: Sequence[bytes]) -> bytes:
    """Frame payloads as `u32 length | bytes` each (the version 1 writer)."""
    parts: list[bytes] = []
    for p in payloads:
        parts.append(_U32.pack(len(p)))
        parts.append(p)
    return b"".join(parts)


def decode_v1(value: bytes, count: int, where: str = "") -> list[bytes]:
    """Split a version 1 value into its `count` payloads; `DecodeError` when it does not
    add up."""
    out: list[bytes] = []
    pos = 0
    view = memoryview(value)
    for _ in range(count):
        if pos + 4 > len(value):
            raise DecodeError(f"WAL record {where} (version 1): value shorter than its entry count")
        (n,) = _U32.unpack_from(value, pos)
        pos += 4
        if pos + n > len(value):
            raise DecodeError(f"WAL record {where} (version 1): entry runs past the record value")
        out.append(bytes(view[pos : pos + n]))
        pos += n
    if pos != len(value):
        raise DecodeError(f"WAL record {where} (version 1): trailing bytes after the last entry")
    return out


# --- version 2 ----------------------------------------------------------------------------


class _Batches:
    """The group's batches being built: per schema message, the entries' record batch
    messages, and the Append dicts that must learn where their rows start."""

    def __init__(self) -> None:
        self.index: dict[bytes, int] = {}
        self.bodies: list[list[bytes]] = []
        self.streams: list[list[bytes]] = []
        self.users: list[list[dict[str, Any]]] = []

    def add(self, stream: bytes, command: dict[str, Any]) -> None:
        split = split_stream(stream)
        if split is None:  # not framed as expected: decode, re-encode
            split = split_stream(table_to_ipc(ipc_to_table(stream).combine_chunks()))
            if split is None:
                raise CodecError("cannot re-encode an Append's batch as one IPC stream")
        head, body = split
        i = self.index.get(head)
        if i is None:
            i = self.index[head] = len(self.bodies)
            self.bodies.append([])
            self.streams.append([])
            self.users.append([])
        self.bodies[i].append(body)
        self.streams[i].append(stream)
        self.users[i].append(command)
        command["batch"] = i

    def encode(self) -> list[bytes]:
        """One stream per schema, one record batch each; sets every Append's row_base."""
        out = []
        for head, bodies, streams, users in zip(
            self.index, self.bodies, self.streams, self.users, strict=True
        ):
            table = ipc_to_table(join_stream(head, bodies), validate=False)
            batches = table.to_batches()
            if all(bodies) and len(batches) == len(bodies):  # then each body is one batch
                counts = [b.num_rows for b in batches]
            else:  # some stream held several batches: count each one's rows
                counts = [ipc_to_table(s, validate=False).num_rows for s in streams]
            base = 0
            for command, n in zip(users, counts, strict=True):
                command["row_base"] = base
                base += n
            # one batch already is the spliced stream; several are combined into one
            out.append(
                join_stream(head, bodies)
                if len(batches) == 1
                else table_to_ipc(table.combine_chunks())
            )
        return out


def encode_v2(entries: Sequence[WalEntry], first: int | None = None) -> bytes:
    """A group of entries as one ``wal_group`` record (the version 2 writer). With
    `first`, the entries are written at LSNs `first`, `first` + 1, ... (the LSNs the log
    gave them), whatever their own ``lsn`` says."""
    batches = _Batches()
    records = []
    for n, entry in enumerate(entries):
        record = entry_to_record(entry, None if first is None else first + n)
        commands = []
        for name, command in record["commands"]:
            if name == _APPEND_V1:
                command = dict(command)
                batches.add(command.pop("batch"), command)
            commands.append((_V2_NS + name[len(_V1_NS) :], command))
        record["commands"] = commands
        records.append(record)
    streams = batches.encode()
    return encode_record(WAL_GROUP, {"entries": records, "batches": streams})


def decode_v2(value: bytes, first: int, count: int, where: str = "") -> list[WalEntry]:
    """The entries of a version 2 value; `DecodeError` naming the record when the value is
    garbled or does not match its headers."""
    try:
        _, group = decode_record(value, expected=WAL_GROUP)
    except CodecError as e:
        raise type(e)(f"WAL record {where} (version 2): {e}") from e
    try:
        streams: list[bytes] = group["batches"]
        records: list[dict[str, Any]] = group["entries"]
        if len(records) != count:
            raise DecodeError(f"holds {len(records)} entries, its header says {count}")
        rows = [-1] * len(streams)  # each batch's row count, once asked
        dests = _Dests()
        out = []
        for i, record in enumerate(records):
            if record["lsn"] != first + i:
                raise DecodeError(f"entry {i} carries LSN {record['lsn']}, expected {first + i}")
            commands = tuple(
                _append_in(command, streams, rows, dests)
                if name == _APPEND_V2
                else command_in(_V1_NS + name[len(_V2_NS) :], command)
                for name, command in record["commands"]
            )
            t = record["txn"]
            txn = TxnContext(t["start_ts"], t["commit_ts"], tuple(map(dests.get, t["memo"])))
            out.append(WalEntry(record["lsn"], txn, commands))
        return out
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise DecodeError(
            f"WAL record {where} (version 2): garbled: {type(e).__name__}: {e}"
        ) from e
    except DecodeError as e:
        raise DecodeError(f"WAL record {where} (version 2): {e}") from e


class _Dests(dict[tuple[int, int, int, int], Dest]):
    """The `Dest`s of one record, each made once: a record's entries name the same few
    blocks over and over, and a `Dest` costs more to build than to look up."""

    def get(self, d: dict[str, int]) -> Dest:  # type: ignore[override]
        key = (d["db_id"], d["table_id"], d["segment_id"], d["block_id"])
        dest = dict.get(self, key)
        if dest is None:
            dest = self[key] = Dest(*key)
        return dest


def _append_in(
    command: dict[str, Any], streams: list[bytes], rows: list[int], dests: _Dests
) -> Append:
    b = command["batch"]
    if not 0 <= b < len(streams):
        raise DecodeError(f"an Append names batch {b}; the record has {len(streams)}")
    if rows[b] < 0:
        rows[b] = ipc_to_table(streams[b]).num_rows
    base = command["row_base"]
    infos = []
    for i in command["infos"]:
        src = base + i["src_offset"]
        if i["src_offset"] < 0 or i["src_length"] < 0 or src + i["src_length"] > rows[b]:
            raise DecodeError(
                f"an Append's rows {src}..+{i['src_length']} point past batch {b}'s {rows[b]} rows"
            )
        infos.append(
            AppendInfo(
                src, i["src_length"], dests.get(i["dest"]), i["dest_offset"], i["dest_length"]
            )
        )
    return Append(tuple(infos), streams[b])


class _Group:
    """A version 2 value, decoded on first use (`LazyEntry`)."""

    __slots__ = ("_entries", "_value", "count", "first", "where")

    def __init__(self, value: bytes, first: int, count: int, where: str) -> None:
        self._value = value
        self.first = first
        self.count = count
        self.where = where
        self._entries: list[WalEntry] | None = None

    def entries(self) -> list[WalEntry]:
        if self._entries is None:
            self._entries = decode_v2(self._value, self.first, self.count, self.where)
            self._value = b""
        return self._entries


class LazyEntry(EncodedEntry):
    """A payload of a version 2 record: its entry is decoded, with the whole record's,
    when first asked for (`decode_entry`).

    Why lazy: a log driver reads every record when it opens, to find the log's valid
    run, but only the entries it then hands on are applied. Decoding them there, in one
    go per record, keeps the opening to headers, and puts the decoding where the
    replaying caller chose the conditions (`tn.checkpoint.recovery` pauses the garbage
    collector, which would otherwise walk the growing heap again and again)."""

    _group: _Group
    _index: int

    @property
    def entry(self) -> WalEntry:  # type: ignore[override]  # read-only where EncodedEntry has a field
        return self._group.entries()[self._index]


def lazy_payloads(value: bytes, first: int, count: int, where: str = "") -> list[bytes]:
    """The payloads of a version 2 value, decoded on first use; the envelope is checked
    now (a value that is not a ``wal_group`` record is refused at once)."""
    try:
        name = schema_of(value)
    except CodecError as e:
        raise type(e)(f"WAL record {where} (version 2): {e}") from e
    if name != WAL_GROUP:
        raise UnsupportedFormatError(
            f"WAL record {where} (version 2): holds a {name!r} record, expected {WAL_GROUP!r}"
        )
    group = _Group(value, first, count, where)
    out: list[bytes] = []
    for i in range(count):
        p = LazyEntry()
        p._group = group
        p._index = i
        out.append(p)
    return out


def entries_of(payloads: Sequence[bytes]) -> list[WalEntry] | None:
    """The entries a group of payloads carries, or None when any payload is not an
    `EncodedEntry` (then the record is written as version 1)."""
    out = []
    for p in payloads:
        if not isinstance(p, EncodedEntry):
            return None
        out.append(p.entry)
    return out


__all__ = [
    "FRAME_OVERHEAD",
    "RECORD_V1",
    "RECORD_V2",
    "RECORD_VERSIONS",
    "check_version",
    "decode_v1",
    "decode_v2",
    "encode_v1",
    "encode_v2",
    "entries_of",
    "lazy_payloads",
]
