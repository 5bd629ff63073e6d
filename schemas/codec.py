"""The one codec for every record kwal puts on Kafka or object storage.

A record is a versioned envelope around an Avro body written without a schema
(fastavro's schemaless encoding), so a reader knows, before decoding a single
field, whether it can decode the bytes at all::

    offset 0      2         3          4                4+n
           +------+---------+----------+----------------+------------------------+
           | "KW" | version | n (u8)   | schema name    | Avro body (schemaless) |
           |      | = 1     |          | n bytes, ASCII |                        |
           +------+---------+----------+----------------+------------------------+

- *magic* ``b"KW"`` tells a kwal record from anything else on a topic or in a
  bucket.
- *version* is the envelope format. A reader refuses a version it does not
  know (`UnsupportedFormatError`) rather than guessing: a newer writer may have
  changed the layout.
- *schema name* is the stem of an ``.avsc`` file in this package (``wal_entry``
  for ``wal_entry.avsc``). It names the writer's schema exactly; the Avro body
  carries no field names or types, so the reader must have that file. An
  incompatible change to a schema therefore gets a new name (``wal_entry_v2``)
  and the old file stays, so old WAL segments and topics stay readable.

Generic API: `encode_record` / `decode_record` work on plain dicts for any
schema in this folder (add ``foo.avsc`` and ``encode_record("foo", {...})``
works). Avro unions of *several* record types are written and read as
``(full_name, dict)`` tuples (fastavro's tuple notation), so
``decode_record(encode_record(n, r))[1] == r`` holds for them too; a union of
``null`` and one record reads back as ``None`` or the dict. A schema can use a
named type from another file if that file is named after the type's full
name (fastavro's ``load_schema`` convention, e.g. ``kwal.common.Dest.avsc``).

Typed API for the WAL: `encode_entry` / `decode_entry` turn `schemas.wal`
dataclasses into the ``wal_entry`` record and back, exactly
(``decode_entry(encode_entry(e)) == e``). `encode_entry` returns an `EncodedEntry`:
the bytes, with the entry they encode attached, so that the Kafka WAL writer can
regroup a record's entries into one columnar payload (`schemas.wal_record`, format
version 2) without decoding them again.

This is on the commit hot path: parsed schemas and the envelope prefix are
cached per name, and the dataclass <-> dict conversions are written out by hand.
"""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastavro import schemaless_reader, schemaless_writer
from fastavro.schema import load_schema

from schemas.avro_binary import ARRAY_END, UNFIT, long_bytes
from schemas.exceptions import (
    DecodeError,
    EncodeError,
    UnexpectedSchemaError,
    UnsupportedFormatError,
)
from schemas.wal import (
    Append,
    AppendInfo,
    CatalogKind,
    CatalogReason,
    ColumnDef,
    ColumnType,
    Command,
    Delete,
    Dest,
    EntryNode,
    TableSchema,
    TxnContext,
    UpdateCatalog,
    WalEntry,
)

MAGIC = b"KW"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = frozenset({FORMAT_VERSION})
WAL_ENTRY = "wal_entry"

SCHEMA_DIR = Path(__file__).parent
_NAME_RE = re.compile(r"[a-z][a-z0-9_.]{0,63}")


@dataclass(frozen=True, slots=True)
class _Schema:
    name: str
    parsed: Any  # fastavro's parsed schema
    prefix: bytes  # the whole envelope header for this name


_cache: dict[str, _Schema] = {}
_cache_lock = threading.Lock()


def known_schemas() -> list[str]:
    """Names of every schema this reader has (the ``.avsc`` stems in `SCHEMA_DIR`)."""
    return sorted(p.stem for p in SCHEMA_DIR.glob("*.avsc"))


def _schema(name: str) -> _Schema:
    cached = _cache.get(name)
    if cached is not None:
        return cached
    with _cache_lock:
        cached = _cache.get(name)
        if cached is not None:
            return cached
        path = SCHEMA_DIR / f"{name}.avsc"
        if not _NAME_RE.fullmatch(name) or not path.is_file():
            raise UnsupportedFormatError(
                f"unknown schema {name!r}; this reader supports: {', '.join(known_schemas())}"
            )
        raw = name.encode("ascii")
        prefix = MAGIC + bytes((FORMAT_VERSION, len(raw))) + raw
        cached = _Schema(name, load_schema(str(path)), prefix)
        _cache[name] = cached
        return cached


def envelope_prefix(schema_name: str) -> bytes:
    """The envelope header of a record of `schema_name` (magic, version, name): what
    `encode_record` writes before the body, for an encoder that writes the body itself."""
    return _schema(schema_name).prefix


def parsed_schema(schema_name: str) -> Any:
    """fastavro's parsed form of ``<schema_name>.avsc`` (what `encode_record` writes with)."""
    return _schema(schema_name).parsed


def encode_record(schema_name: str, record: dict[str, Any]) -> bytes:
    """Wrap `record` (a dict matching ``<schema_name>.avsc``) in a kwal envelope."""
    schema = _schema(schema_name)
    out = io.BytesIO()
    out.write(schema.prefix)
    try:
        schemaless_writer(out, schema.parsed, record)
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, IndexError) as e:
        raise EncodeError(f"record does not fit schema {schema_name!r}: {type(e).__name__}: {e}") from e
    return out.getvalue()


def _header(data: bytes) -> tuple[str, int]:
    """Check magic and version; return the schema name and where the body starts."""
    if data[:2] != MAGIC:
        raise UnsupportedFormatError(
            f"not a kwal record: starts with {bytes(data[:4])!r}, expected magic {MAGIC!r}"
        )
    if len(data) < 4:
        raise DecodeError(f"truncated kwal record header: {len(data)} bytes")
    version = data[2]
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedFormatError(
            f"unsupported kwal record format version {version}; this reader supports "
            f"version(s) {', '.join(map(str, sorted(SUPPORTED_VERSIONS)))} (written by a newer kwal?)"
        )
    end = 4 + data[3]
    if len(data) < end:
        raise DecodeError(f"truncated kwal record header: {len(data)} bytes, schema name needs {end}")
    try:
        name = data[4:end].decode("ascii")
    except UnicodeDecodeError as e:
        raise UnsupportedFormatError(f"kwal record with a non-ASCII schema name {bytes(data[4:end])!r}") from e
    return name, end


def schema_of(data: bytes) -> str:
    """The schema name in a record's envelope, without decoding the body."""
    return _header(data)[0]


def decode_record(data: bytes, expected: str | None = None) -> tuple[str, dict[str, Any]]:
    """Unwrap a kwal envelope: return (schema name, record dict).

    Raises `UnsupportedFormatError` for bytes this reader must not decode,
    `UnexpectedSchemaError` when `expected` is given and the record is of
    another schema, `DecodeError` when the body is truncated or garbled.
    """
    name, start = _header(data)
    if expected is not None and name != expected:
        raise UnexpectedSchemaError(f"expected a {expected!r} record, found {name!r}")
    schema = _schema(name)
    buf = io.BytesIO(data)
    buf.seek(start)
    try:
        record = schemaless_reader(
            buf,
            schema.parsed,
            None,
            return_record_name=True,
            return_record_name_override=True,
        )
    except EOFError as e:
        raise DecodeError(f"cannot decode {name!r} record ({len(data)} bytes): body truncated") from e
    except Exception as e:  # fastavro raises ValueError, IndexError, ... on garbled bytes
        raise DecodeError(
            f"cannot decode {name!r} record ({len(data)} bytes): {type(e).__name__}: {e}"
        ) from e
    if buf.tell() != len(data):
        raise DecodeError(
            f"garbled {name!r} record: {len(data) - buf.tell()} trailing bytes after the body"
        )
    if not isinstance(record, dict):
        raise DecodeError(f"garbled {name!r} record: body is not a record")
    return name, record


# --- WAL entries: dataclasses <-> dicts -------------------------------------------------

_NS = "kwal.wal."
_UPDATE_CATALOG = _NS + "UpdateCatalog"
_APPEND = _NS + "Append"
_DELETE = _NS + "Delete"

_KINDS = {m.value: m for m in CatalogKind}
_REASONS = {m.value: m for m in CatalogReason}
_COLUMN_TYPES = {m.value: m for m in ColumnType}


def _dest_out(d: Dest) -> dict[str, int]:
    return {"db_id": d.db_id, "table_id": d.table_id, "segment_id": d.segment_id, "block_id": d.block_id}


def _dest_in(d: dict[str, int]) -> Dest:
    return Dest(d["db_id"], d["table_id"], d["segment_id"], d["block_id"])


def _schema_out(s: TableSchema | None) -> dict[str, Any] | None:
    if s is None:
        return None
    return {
        "columns": [
            {"column_id": c.column_id, "name": c.name, "type": c.type.value, "nullable": c.nullable}
            for c in s.columns
        ],
        "primary_key": s.primary_key,
        "version": s.version,
    }


def _schema_in(s: dict[str, Any] | None) -> TableSchema | None:
    if s is None:
        return None
    return TableSchema(
        columns=tuple(
            ColumnDef(c["column_id"], c["name"], _COLUMN_TYPES[c["type"]], c["nullable"])
            for c in s["columns"]
        ),
        primary_key=s["primary_key"],
        version=s["version"],
    )


def _update_catalog_out(c: UpdateCatalog) -> tuple[str, dict[str, Any]]:
    n = c.node
    return _UPDATE_CATALOG, {
        "kind": c.kind.value,
        "dest": _dest_out(c.dest),
        "node": {
            "create_ts": n.create_ts,
            "delete_ts": n.delete_ts,
            "name": n.name,
            "meta_loc": n.meta_loc,
            "delta_loc": n.delta_loc,
            "schema": _schema_out(n.schema),
        },
        "reason": c.reason.value,
    }


def _update_catalog_in(c: dict[str, Any]) -> UpdateCatalog:
    n = c["node"]
    return UpdateCatalog(
        kind=_KINDS[c["kind"]],
        dest=_dest_in(c["dest"]),
        node=EntryNode(
            n["create_ts"], n["delete_ts"], n["name"], n["meta_loc"], n["delta_loc"], _schema_in(n["schema"])
        ),
        reason=_REASONS[c["reason"]],
    )


def _append_out(c: Append) -> tuple[str, dict[str, Any]]:
    return _APPEND, {
        "infos": [
            {
                "src_offset": i.src_offset,
                "src_length": i.src_length,
                "dest": _dest_out(i.dest),
                "dest_offset": i.dest_offset,
                "dest_length": i.dest_length,
            }
            for i in c.infos
        ],
        "batch": c.batch,
    }


def _append_in(c: dict[str, Any]) -> Append:
    return Append(
        infos=tuple(
            AppendInfo(i["src_offset"], i["src_length"], _dest_in(i["dest"]), i["dest_offset"], i["dest_length"])
            for i in c["infos"]
        ),
        batch=c["batch"],
    )


def _delete_out(c: Delete) -> tuple[str, dict[str, Any]]:
    return _DELETE, {"dest": _dest_out(c.dest), "rows": list(c.rows)}


def _delete_in(c: dict[str, Any]) -> Delete:
    return Delete(_dest_in(c["dest"]), tuple(c["rows"]))


_COMMAND_OUT: dict[type, Callable[[Any], tuple[str, dict[str, Any]]]] = {
    UpdateCatalog: _update_catalog_out,
    Append: _append_out,
    Delete: _delete_out,
}
_COMMAND_IN: dict[str, Callable[[dict[str, Any]], Command]] = {
    _UPDATE_CATALOG: _update_catalog_in,
    _APPEND: _append_in,
    _DELETE: _delete_in,
}


def command_in(full_name: str, record: dict[str, Any]) -> Command:
    """A command from its ``wal_entry`` union branch (full name, fields)."""
    return _COMMAND_IN[full_name](record)


def txn_in(t: dict[str, Any]) -> TxnContext:
    """A transaction context from its ``wal_entry`` record."""
    return TxnContext(t["start_ts"], t["commit_ts"], tuple(_dest_in(d) for d in t["memo"]))


def entry_to_record(entry: WalEntry, lsn: int | None = None) -> dict[str, Any]:
    """The ``wal_entry`` dict of an entry (commands as ``(full_name, dict)`` tuples),
    with `lsn` in place of ``entry.lsn`` when given."""
    try:
        commands = [_COMMAND_OUT[type(c)](c) for c in entry.commands]
    except KeyError as e:
        raise EncodeError(f"not a WAL command: {e.args[0]!r}") from e
    t = entry.txn
    return {
        "lsn": entry.lsn if lsn is None else lsn,
        "txn": {"start_ts": t.start_ts, "commit_ts": t.commit_ts, "memo": [_dest_out(d) for d in t.memo]},
        "commands": commands,
    }


def record_to_entry(record: dict[str, Any]) -> WalEntry:
    """The inverse of `entry_to_record`."""
    return WalEntry(
        lsn=record["lsn"],
        txn=txn_in(record["txn"]),
        commands=tuple(_COMMAND_IN[name](c) for name, c in record["commands"]),
    )


class EncodedEntry(bytes):
    """A WAL entry's payload with the `WalEntry` it holds (``.entry``).

    Why: the WAL writer groups entries into records and, since record format 2, writes
    a group as one columnar payload (`schemas.wal_record`); it needs the entries, not
    their bytes. Entries decoded from a version-2 record are handed on as an
    `EncodedEntry` of no bytes (their encoding is the record's, shared): `decode_entry`
    returns ``.entry`` for those, so every reader of a payload sees the
    same entry whichever record version carried it (an `EncodedEntry` with bytes is
    decoded from them as any payload is)."""

    entry: WalEntry

    @classmethod
    def of(cls, data: bytes, entry: WalEntry) -> EncodedEntry:
        out = cls(data)
        out.entry = entry
        return out


def encode_entry(entry: WalEntry, lsn: int | None = None) -> EncodedEntry:
    """A WAL entry as a kwal record (schema ``wal_entry``).

    `lsn`, when given, is written instead of ``entry.lsn``: the LogStore hands
    out the LSN only inside ``append(lambda lsn: encode_entry(entry, lsn))``, and
    this spares the commit path a ``dataclasses.replace`` of the frozen entry (the
    entry attached to the result is a copy with that LSN only when it differs).
    Out-of-range integers (beyond int64) raise `EncodeError`.
    """
    if lsn is not None and lsn != entry.lsn:
        entry = WalEntry(lsn, entry.txn, entry.commands)
    try:
        data = _rows_entry(entry)
    except UNFIT:
        data = None  # a value that does not fit: the codec says what is wrong
    if data is None:
        data = encode_record(WAL_ENTRY, entry_to_record(entry))
    return EncodedEntry.of(data, entry)


# Entries of Append and Delete commands (every transaction that only writes rows: nearly
# all commits) are written by hand (`schemas.avro_binary`): fastavro's generic writer
# walks the schema for every entry, on the commit path (docs/perf-commit.md,
# "commit->visible (2)"). The bytes are fastavro's own
# (tests/schemas/test_wal_codec.py compares them); entries with catalog commands go
# through the codec. Union branches per `wal_entry.avsc`.


def _command_branch(name: str) -> bytes:
    branches = next(f for f in _schema(WAL_ENTRY).parsed["fields"] if f["name"] == "commands")
    return long_bytes([b["name"] for b in branches["type"]["items"]].index(name))


_APPEND_BRANCH, _DELETE_BRANCH = _command_branch(_APPEND), _command_branch(_DELETE)


def _dest_bytes(d: Dest) -> bytes:
    return b"".join(
        (long_bytes(d.db_id), long_bytes(d.table_id), long_bytes(d.segment_id), long_bytes(d.block_id))
    )


def _rows_entry(entry: WalEntry) -> bytes | None:
    """The ``wal_entry`` record of an entry whose commands all write rows; None otherwise."""
    commands = entry.commands
    if not all(type(c) is Append or type(c) is Delete for c in commands):
        return None
    txn = entry.txn
    parts = [
        _schema(WAL_ENTRY).prefix,
        long_bytes(entry.lsn),
        long_bytes(txn.start_ts),
        long_bytes(txn.commit_ts),
    ]
    if txn.memo:
        parts.append(long_bytes(len(txn.memo)))
        parts += [_dest_bytes(d) for d in txn.memo]
    parts.append(ARRAY_END)
    if commands:
        parts.append(long_bytes(len(commands)))
    for c in commands:
        if type(c) is Append:
            parts.append(_APPEND_BRANCH)
            if c.infos:
                parts.append(long_bytes(len(c.infos)))
            for i in c.infos:
                parts += (
                    long_bytes(i.src_offset),
                    long_bytes(i.src_length),
                    _dest_bytes(i.dest),
                    long_bytes(i.dest_offset),
                    long_bytes(i.dest_length),
                )
            parts += (ARRAY_END, long_bytes(len(c.batch)), c.batch)
        else:
            assert isinstance(c, Delete)
            parts += (_DELETE_BRANCH, _dest_bytes(c.dest))
            if c.rows:
                parts.append(long_bytes(len(c.rows)))
                parts += [long_bytes(r) for r in c.rows]
            parts.append(ARRAY_END)
    parts.append(ARRAY_END)
    return b"".join(parts)


def decode_entry(data: bytes) -> WalEntry:
    """The WAL entry in a kwal record (or attached to an `EncodedEntry`); refuses
    records of any other schema."""
    if isinstance(data, EncodedEntry) and not data:  # an entry of a version 2 record
        return data.entry
    _, record = decode_record(data, expected=WAL_ENTRY)
    try:
        return record_to_entry(record)
    except (KeyError, TypeError, ValueError) as e:
        raise DecodeError(f"garbled {WAL_ENTRY!r} record: {type(e).__name__}: {e}") from e
