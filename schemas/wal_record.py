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

- **version 3** (`encode_v3` / `decode_v3`, what the Kafka WAL writes): as version
  2 (``wal_group3``), except that the common entry -- ONE Append of rows into ONE
  block, that block its only memo (a transaction inserting into one block) -- is no
  Avro record but one row of ``appends``: the entries' metadata as fixed-width
  little-endian int64 columns (`APPEND_COLUMNS`), read as one numpy array. Replay
  applies a run of such entries with a few array operations (`tn.replay.apply_group`)
  instead of a call chain per entry; every other entry (DDL, deletes, updates, rows
  over several blocks, large transactions) stays an Avro record, applied one by one.

The entries decoded from any version are the same `WalEntry` values, up to the
sharing of a batch (and its offsets). A decoded version 2 or 3 record is a `Group`:
its entries (`entries()`), and for replay its ``appends`` columns and its other
entries apart, and its batches as decoding read (and validated) them.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

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
RECORD_V3 = 3
RECORD_VERSIONS = frozenset({RECORD_V1, RECORD_V2, RECORD_V3})
RECORD_LATEST = RECORD_V3  # what the Kafka WAL writes
WAL_GROUP = "wal_group"
WAL_GROUP3 = "wal_group3"
# the columns of a version 3 record's ``appends``, in order (one row per entry)
APPEND_COLUMNS = (
    "lsn",
    "start_ts",
    "commit_ts",
    "batch",  # index into the record's batches
    "row",  # first row in that batch
    "rows",  # row count (>= 1)
    "db_id",
    "table_id",
    "segment_id",
    "block_id",
    "dest_offset",  # first row in the block
)
(A_LSN, A_START, A_CTS, A_BATCH, A_ROW, A_ROWS, A_DB, A_TABLE, A_SEGMENT, A_BLOCK, A_DEST) = range(
    len(APPEND_COLUMNS)
)
_NCOLS = len(APPEND_COLUMNS)
_I64LE = np.dtype("<i8")

_U32 = struct.Struct(">I")
FRAME_OVERHEAD = _U32.size

_V1_NS, _V2_NS, _V3_NS = "kwal.wal.", "kwal.wal2.", "kwal.wal3."
_APPEND_V1 = _V1_NS + "Append"


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


def _group_record(entry: WalEntry, lsn: int | None, batches: _Batches, ns: str) -> dict[str, Any]:
    """An entry's ``GroupEntry`` dict (namespace `ns`): its Appends' rows go to `batches`."""
    record = entry_to_record(entry, lsn)
    commands = []
    for name, command in record["commands"]:
        if name == _APPEND_V1:
            command = dict(command)
            batches.add(command.pop("batch"), command)
        commands.append((ns + name[len(_V1_NS) :], command))
    record["commands"] = commands
    return record


def encode_v2(entries: Sequence[WalEntry], first: int | None = None) -> bytes:
    """A group of entries as one ``wal_group`` record (the version 2 writer). With
    `first`, the entries are written at LSNs `first`, `first` + 1, ... (the LSNs the log
    gave them), whatever their own ``lsn`` says."""
    batches = _Batches()
    records = [
        _group_record(entry, None if first is None else first + n, batches, _V2_NS)
        for n, entry in enumerate(entries)
    ]
    streams = batches.encode()
    return encode_record(WAL_GROUP, {"entries": records, "batches": streams})


def one_block_append(entry: WalEntry) -> AppendInfo | None:
    """The AppendInfo of an entry that is ONE Append of rows into ONE block, that block
    its only memo (a version 3 ``appends`` row), else None."""
    commands = entry.commands
    if len(commands) != 1:
        return None
    append = commands[0]
    if type(append) is not Append or len(append.infos) != 1:
        return None
    info = append.infos[0]
    if info.src_length < 1 or info.dest_length != info.src_length or entry.txn.memo != (info.dest,):
        return None
    return info


def encode_v3(entries: Sequence[WalEntry], first: int | None = None) -> bytes:
    """A group of entries as one ``wal_group3`` record (the version 3 writer); `first` as
    in `encode_v2`."""
    batches = _Batches()
    records = []
    rows: list[tuple[int, WalEntry, AppendInfo, dict[str, Any]]] = []
    for n, entry in enumerate(entries):
        lsn = entry.lsn if first is None else first + n
        info = one_block_append(entry)
        if info is None:
            records.append(_group_record(entry, lsn, batches, _V3_NS))
            continue
        slot: dict[str, Any] = {}  # learns the batch and where its rows start in it
        batches.add(entry.commands[0].batch, slot)  # type: ignore[union-attr]
        rows.append((lsn, entry, info, slot))
    streams = batches.encode()
    table = np.zeros((_NCOLS, len(rows)), dtype=_I64LE)
    if rows:
        try:
            table[:] = np.array(
                [
                    (
                        lsn,
                        e.txn.start_ts,
                        e.txn.commit_ts,
                        slot["batch"],
                        slot["row_base"] + i.src_offset,
                        i.src_length,
                        i.dest.db_id,
                        i.dest.table_id,
                        i.dest.segment_id,
                        i.dest.block_id,
                        i.dest_offset,
                    )
                    for lsn, e, i, slot in rows
                ],
                dtype=np.int64,
            ).T
        except OverflowError as e:
            raise CodecError(f"a WAL entry's metadata does not fit int64: {e}") from e
    return encode_record(
        WAL_GROUP3, {"appends": table.tobytes(), "entries": records, "batches": streams}
    )


class Group:
    """A decoded version 2 or 3 record: ``appends`` (version 3's one-block Append
    entries: `APPEND_COLUMNS`, each a list of the entries' values; ``[]`` when none, as
    in version 2), ``others``
    (every other entry, decoded, in LSN order), ``streams`` (the Arrow IPC batches
    their rows are in) and ``tables`` (those batches as decoding read and validated
    them; None for one no entry names). `entries()`: all of them as `WalEntry` values,
    in LSN order."""

    __slots__ = ("appends", "others", "streams", "first", "count", "tables", "_entries")

    def __init__(
        self,
        appends: list[list[int]],
        others: list[WalEntry],
        streams: list[bytes],
        first: int,
        count: int,
        tables: list[pa.Table | None] | None = None,
    ) -> None:
        self.appends = appends
        self.tables = tables if tables is not None else [None] * len(streams)
        self.others = others
        self.streams = streams
        self.first = first
        self.count = count
        self._entries: list[WalEntry] | None = None

    def entries(self) -> list[WalEntry]:
        if self._entries is None:
            out: list[WalEntry | None] = [None] * self.count
            for e in self.others:
                out[e.lsn - self.first] = e
            if self.appends:
                dests = _Dests()
                for row in zip(*self.appends, strict=True):
                    dest = dests.get(
                        {
                            "db_id": row[A_DB],
                            "table_id": row[A_TABLE],
                            "segment_id": row[A_SEGMENT],
                            "block_id": row[A_BLOCK],
                        }
                    )
                    n = row[A_ROWS]
                    out[row[A_LSN] - self.first] = WalEntry(
                        row[A_LSN],
                        TxnContext(row[A_START], row[A_CTS], (dest,)),
                        (
                            Append(
                                (AppendInfo(row[A_ROW], n, dest, row[A_DEST], n),),
                                self.streams[row[A_BATCH]],
                            ),
                        ),
                    )
            self._entries = out  # type: ignore[assignment]  # every slot filled (decode checks)
        return self._entries  # type: ignore[return-value]


def decode_v2(value: bytes, first: int, count: int, where: str = "") -> list[WalEntry]:
    """The entries of a version 2 value; `DecodeError` naming the record when the value is
    garbled or does not match its headers."""
    return decode_group(value, RECORD_V2, first, count, where).entries()


def decode_v3(value: bytes, first: int, count: int, where: str = "") -> list[WalEntry]:
    """The entries of a version 3 value (`decode_v2`'s errors)."""
    return decode_group(value, RECORD_V3, first, count, where).entries()


def decode_group(value: bytes, version: int, first: int, count: int, where: str = "") -> Group:
    """A version 2 or 3 value as a `Group`; `DecodeError` naming the record when the value
    is garbled or does not match its headers."""
    label = f"WAL record {where} (version {version})"
    name, ns = (WAL_GROUP, _V2_NS) if version == RECORD_V2 else (WAL_GROUP3, _V3_NS)
    try:
        _, group = decode_record(value, expected=name)
    except CodecError as e:
        raise type(e)(f"{label}: {e}") from e
    try:
        streams: list[bytes] = group["batches"]
        records: list[dict[str, Any]] = group["entries"]
        tables: list[pa.Table | None] = [None] * len(streams)  # each batch, once read
        appends = _appends_in(group["appends"], streams, tables) if version == RECORD_V3 else []
        k = len(appends[A_LSN]) if appends else 0
        if len(records) + k != count:
            raise DecodeError(f"holds {len(records) + k} entries, its header says {count}")
        dests = _Dests()
        append_name = ns + "Append"
        others = []
        for record in records:
            commands = tuple(
                _append_in(command, streams, tables, dests)
                if cname == append_name
                else command_in(_V1_NS + cname[len(ns) :], command)
                for cname, command in record["commands"]
            )
            t = record["txn"]
            txn = TxnContext(t["start_ts"], t["commit_ts"], tuple(map(dests.get, t["memo"])))
            others.append(WalEntry(record["lsn"], txn, commands))
        _check_lsns(appends[A_LSN] if k else [], [e.lsn for e in others], first, count)
        return Group(appends, others, streams, first, count, tables)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise DecodeError(f"{label}: garbled: {type(e).__name__}: {e}") from e
    except DecodeError as e:
        raise DecodeError(f"{label}: {e}") from e


def _check_lsns(appends: list[int], others: list[int], first: int, count: int) -> None:
    """The entries carry LSNs first, first + 1, ..., first + count - 1, each once, and each
    part lists them in order."""
    if not appends:
        for i, lsn in enumerate(others):
            if lsn != first + i:
                raise DecodeError(f"entry {i} carries LSN {lsn}, expected {first + i}")
        return
    every = range(first, first + count)
    if others:
        if sorted(set(others)) != others:
            raise DecodeError("the other entries' LSNs are out of order")
        if sorted(appends + others) != list(every):
            raise DecodeError("the entries' LSNs are out of order or outside the record")
    if sorted(set(appends)) != appends or appends[0] < first or appends[-1] >= first + count:
        raise DecodeError("the appends' LSNs are out of order or outside the record")


def _table(streams: list[bytes], tables: list[pa.Table | None], b: int) -> pa.Table:
    """Batch b of the record, read (and validated in full) once: replay takes its
    columns from this read (`Group.tables`), not from a second one."""
    table = tables[b]
    if table is None:
        table = tables[b] = ipc_to_table(streams[b])
    return table


def _appends_in(
    data: bytes, streams: list[bytes], tables: list[pa.Table | None]
) -> list[list[int]]:
    """A version 3 record's ``appends``: its columns as lists (`APPEND_COLUMNS` order),
    checked. Lists, not arrays: a record holds a few entries, where numpy's per-call
    cost would exceed the work."""
    if len(data) % (8 * _NCOLS):
        raise DecodeError(
            f"appends hold {len(data)} bytes, not a whole number of {_NCOLS} int64 columns"
        )
    cols: list[list[int]] = np.frombuffer(data, dtype=_I64LE).reshape(_NCOLS, -1).tolist()
    if not cols[0]:
        return cols
    used = set(cols[A_BATCH])
    if min(used) < 0 or max(used) >= len(streams):
        raise DecodeError(f"an Append names a batch outside the record's {len(streams)}")
    rows = {b: _table(streams, tables, b).num_rows for b in used}
    if min(cols[A_ROW]) < 0 or min(cols[A_ROWS]) < 1:
        raise DecodeError("an Append's rows point outside its batch")
    for b, row, n in zip(cols[A_BATCH], cols[A_ROW], cols[A_ROWS], strict=True):
        if row + n > rows[b]:
            raise DecodeError(f"an Append's rows {row}..+{n} point past batch {b}'s {rows[b]} rows")
    if min(min(c) for c in cols[A_DB : A_DEST + 1]) < 0:
        raise DecodeError("an Append names a negative node id or row")
    return cols


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
    command: dict[str, Any], streams: list[bytes], tables: list[pa.Table | None], dests: _Dests
) -> Append:
    b = command["batch"]
    if not 0 <= b < len(streams):
        raise DecodeError(f"an Append names batch {b}; the record has {len(streams)}")
    rows = _table(streams, tables, b).num_rows
    base = command["row_base"]
    infos = []
    for i in command["infos"]:
        src = base + i["src_offset"]
        if i["src_offset"] < 0 or i["src_length"] < 0 or src + i["src_length"] > rows:
            raise DecodeError(
                f"an Append's rows {src}..+{i['src_length']} point past batch {b}'s {rows} rows"
            )
        infos.append(
            AppendInfo(
                src, i["src_length"], dests.get(i["dest"]), i["dest_offset"], i["dest_length"]
            )
        )
    return Append(tuple(infos), streams[b])


class LazyGroup(bytes):
    """A version 2 or 3 value, decoded on first use (`group()`).

    It is also the payload a log driver keeps for each LSN of the record (`lazy_payloads`
    with `shared`): ONE object per record, where a `LazyEntry` per entry made ~2 objects
    per entry that the cyclic collector then walked, at every collection, for as long as
    the driver kept them. `payload_at` gives an LSN's own payload. As bytes it is empty
    (its encoding is the record's)."""

    _group: Group | None
    _value: bytes
    version: int
    first: int
    size: int  # entries (not `count`: a bytes method)
    where: str

    def __new__(cls, value: bytes, version: int, first: int, count: int, where: str) -> LazyGroup:
        self = super().__new__(cls)
        self._value = value
        self.version = version
        self.first = first
        self.size = count
        self.where = where
        self._group = None
        return self

    def group(self) -> Group:
        if self._group is None:
            self._group = decode_group(self._value, self.version, self.first, self.size, self.where)
            self._value = b""
        return self._group

    def entries(self) -> list[WalEntry]:
        return self.group().entries()

    def at(self, lsn: int) -> LazyEntry:
        """The payload of the entry at `lsn` (a `LazyEntry`)."""
        if not self.first <= lsn < self.first + self.size:
            raise IndexError(f"LSN {lsn} is not in WAL record {self.where}")
        p = LazyEntry()
        p._group = self
        p._index = lsn - self.first
        return p


class LazyEntry(EncodedEntry):
    """A payload of a version 2 or 3 record: its entry is decoded, with the whole
    record's, when first asked for (`decode_entry`).

    Why lazy: a log driver reads every record when it opens, to find the log's valid
    run, but only the entries it then hands on are applied. Decoding them there, in one
    go per record, keeps the opening to headers, and puts the decoding where the
    replaying caller chose the conditions (`tn.checkpoint.recovery` pauses the garbage
    collector, which would otherwise walk the growing heap again and again)."""

    _group: LazyGroup
    _index: int

    @property
    def entry(self) -> WalEntry:  # type: ignore[override]  # read-only where EncodedEntry has a field
        return self._group.entries()[self._index]


def group_of(payload: bytes) -> LazyGroup | None:
    """The record a payload came in, when it came in a version 2 or 3 record."""
    if isinstance(payload, LazyGroup):
        return payload
    return payload._group if isinstance(payload, LazyEntry) else None


def payload_at(payload: bytes, lsn: int) -> bytes:
    """The payload of the entry at `lsn` from what a driver keeps for it: itself, or its
    record's shared `LazyGroup` (`lazy_payloads` with `shared`)."""
    return payload.at(lsn) if isinstance(payload, LazyGroup) else payload


def lazy_payloads(
    value: bytes,
    first: int,
    count: int,
    where: str = "",
    version: int = RECORD_V2,
    shared: bool = False,
) -> list[bytes]:
    """The payloads of a version 2 or 3 value, decoded on first use; the envelope is
    checked now (a value that is not a ``wal_group`` / ``wal_group3`` record is refused
    at once). `shared`: every payload is the record's one `LazyGroup` (a driver's
    bookkeeping; `payload_at` gives each entry's own), else one `LazyEntry` each."""
    expected = WAL_GROUP if version == RECORD_V2 else WAL_GROUP3
    try:
        name = schema_of(value)
    except CodecError as e:
        raise type(e)(f"WAL record {where} (version {version}): {e}") from e
    if name != expected:
        raise UnsupportedFormatError(
            f"WAL record {where} (version {version}): holds a {name!r} record, "
            f"expected {expected!r}"
        )
    group = LazyGroup(value, version, first, count, where)
    if shared:
        return [group] * count
    return [group.at(first + i) for i in range(count)]


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
    "APPEND_COLUMNS",
    "FRAME_OVERHEAD",
    "RECORD_LATEST",
    "RECORD_V1",
    "RECORD_V2",
    "RECORD_V3",
    "RECORD_VERSIONS",
    "Group",
    "LazyGroup",
    "check_version",
    "decode_group",
    "decode_v1",
    "decode_v2",
    "decode_v3",
    "encode_v1",
    "encode_v2",
    "encode_v3",
    "entries_of",
    "group_of",
    "lazy_payloads",
    "one_block_append",
    "payload_at",
]
