"""Logtail records (seed 001; DESIGN.md "Logtail records") and their codec.

One topic per table carries that table's records in commit (= LSN) order:

- `Changes`: one transaction's inserts and deletes on the table. Inserts are
  an Arrow batch with `__row_id`, `__commit_ts` and the table's columns;
  deletes an Arrow batch with `__row_id`, `__commit_ts` and the primary key.
- `Heartbeat`: every change with commit ts <= the record's ts has been sent.
- `BlockMeta`: a block was dumped to object storage (rows and deletes as
  Parquet); in-memory rows of that block committed before `drop_before_ts`
  may be dropped by a CN.
- `Checkpoint`: a manifest covering everything up to the record's ts exists.

The catalog topic carries `Catalog` records (DDL) for every table.

A row id names a row's physical place: `block_id << 16 | offset` (a block
holds at most 8192 rows), unique within a table, the same on the TN, in
the WAL, in the logtail and in object storage.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from schemas.avro_binary import (
    UNFIT,
    long_bytes,
    optional_bytes,
    read_long,
    read_optional_bytes,
    read_str,
    str_bytes,
)
from schemas.codec import decode_record, encode_record, envelope_prefix, parsed_schema
from schemas.wal import ColumnDef, ColumnType, TableSchema

LOGTAIL = "logtail"
# The Kafka key of every heartbeat; every other record's key is unique (`record_key`).
# The catalog and logtail topics are compacted (infra.topics): only the newest heartbeat
# of a topic survives the log cleaner, every other record is kept.
HEARTBEAT_KEY = b"kwal.heartbeat"
ROW_ID = "__row_id"
COMMIT_TS = "__commit_ts"
_OFFSET_BITS = 16


def make_row_id(block_id: int, offset: int) -> int:
    return (block_id << _OFFSET_BITS) | offset


def row_block(row_id: int) -> int:
    return row_id >> _OFFSET_BITS


def row_offset(row_id: int) -> int:
    return row_id & ((1 << _OFFSET_BITS) - 1)


class CatalogOp(StrEnum):
    CREATE_DATABASE = "create_database"
    DROP_DATABASE = "drop_database"
    CREATE_TABLE = "create_table"
    DROP_TABLE = "drop_table"
    ALTER_TABLE = "alter_table"


@dataclass(frozen=True, slots=True)
class Changes:
    inserts: bytes | None = None  # Arrow IPC
    deletes: bytes | None = None  # Arrow IPC


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pass


LARGE_TXN_SUFFIX = f"-{0:020d}.parquet"  # a large transaction's block object key ends so


@dataclass(frozen=True, slots=True)
class BlockMeta:
    block_id: int
    meta_loc: str
    drop_before_ts: int
    delta_loc: str = ""
    create_ts: int = 0
    delete_ts: int = 0

    def alive_at(self, ts: int) -> bool:
        """Whether the block's objects are part of its table at `ts`."""
        return self.create_ts <= ts and not (self.delete_ts and self.delete_ts <= ts)

    @property
    def large_txn(self) -> bool:
        """A block a large transaction committed with its rows in object storage
        (FORMAT.md 5): created at `create_ts` by that transaction, its object's key has
        ts 0 (`-00000000000000000000.parquet`: written before the commit ts was known)
        and its rows never came as `Changes`, so a reader that follows `Changes` must
        read them from `meta_loc` (their `__commit_ts` is `create_ts`)."""
        return bool(self.create_ts) and not self.delete_ts and self.meta_loc.endswith(LARGE_TXN_SUFFIX)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    manifest_key: str


@dataclass(frozen=True, slots=True)
class Catalog:
    op: CatalogOp
    db_id: int = 0
    schema: TableSchema | None = None


Body = Changes | Heartbeat | BlockMeta | Checkpoint | Catalog


@dataclass(frozen=True, slots=True)
class LogtailRecord:
    database: str
    table: str
    commit_ts: int
    body: Body
    table_id: int = 0
    lsn: int = 0


_NS = "kwal.logtail."


def _schema_out(s: TableSchema | None) -> dict[str, Any] | None:
    if s is None:
        return None
    return {
        "primary_key": s.primary_key,
        "version": s.version,
        "columns": [
            {"column_id": c.column_id, "name": c.name, "type": c.type.value, "nullable": c.nullable}
            for c in s.columns
        ],
    }


def _schema_in(s: dict[str, Any] | None) -> TableSchema | None:
    if s is None:
        return None
    cols = tuple(
        ColumnDef(c["column_id"], c["name"], ColumnType(c["type"]), c["nullable"]) for c in s["columns"]
    )
    return TableSchema(cols, s["primary_key"], s["version"])


def _body_out(body: Body) -> tuple[str, dict[str, Any]]:
    match body:
        case Changes():
            return _NS + "Changes", {"inserts": body.inserts, "deletes": body.deletes}
        case Heartbeat():
            return _NS + "Heartbeat", {}
        case BlockMeta():
            return _NS + "BlockMeta", {
                "block_id": body.block_id,
                "meta_loc": body.meta_loc,
                "delta_loc": body.delta_loc,
                "drop_before_ts": body.drop_before_ts,
                "create_ts": body.create_ts,
                "delete_ts": body.delete_ts,
            }
        case Checkpoint():
            return _NS + "Checkpoint", {"manifest_key": body.manifest_key}
        case Catalog():
            return _NS + "Catalog", {
                "op": body.op.value,
                "db_id": body.db_id,
                "schema": _schema_out(body.schema),
            }
    raise TypeError(f"not a logtail body: {body!r}")


def _body_in(name: str, d: dict[str, Any]) -> Body:
    kind = name.removeprefix(_NS)
    if kind == "Changes":
        return Changes(d["inserts"], d["deletes"])
    if kind == "Heartbeat":
        return Heartbeat()
    if kind == "BlockMeta":
        return BlockMeta(
            d["block_id"], d["meta_loc"], d["drop_before_ts"], d["delta_loc"], d["create_ts"], d["delete_ts"]
        )
    if kind == "Checkpoint":
        return Checkpoint(d["manifest_key"])
    if kind == "Catalog":
        return Catalog(CatalogOp(d["op"]), d["db_id"], _schema_in(d["schema"]))
    raise ValueError(f"unknown logtail body type {name!r}")


def record_key(record: LogtailRecord, unique: bytes) -> bytes:
    """The Kafka key of a logtail record: `HEARTBEAT_KEY` for a heartbeat, else `unique`
    (a key no other record of the topic has, such as `<producer id>:<sequence>`)."""
    return HEARTBEAT_KEY if isinstance(record.body, Heartbeat) else unique


# Changes and Heartbeat (every commit's records, on the TN's publisher thread and in every
# CN) are written and read by hand (`schemas.avro_binary`): fastavro's generic writer and
# reader walk the schema for every record (docs/perf-commit.md, "commit->visible (2)").
# The bytes are fastavro's own (tests/schemas/test_logtail_avro.py compares them); every
# other body, and anything these do not read cleanly, goes through the codec.
_PREFIX = envelope_prefix(LOGTAIL)
_BRANCH = {
    branch["name"].removeprefix(_NS): long_bytes(i)
    for i, branch in enumerate(
        next(f for f in parsed_schema(LOGTAIL)["fields"] if f["name"] == "body")["type"]
    )
}
_CHANGES, _HEARTBEAT = _BRANCH["Changes"], _BRANCH["Heartbeat"]


def _common(record: LogtailRecord) -> bytes | None:
    """A Changes or Heartbeat record written by hand; None for any other body."""
    body = record.body
    if isinstance(body, Changes):
        tail: tuple[bytes, ...] = (_CHANGES, optional_bytes(body.inserts), optional_bytes(body.deletes))
    elif isinstance(body, Heartbeat):
        tail = (_HEARTBEAT,)
    else:
        return None
    return b"".join((
        _PREFIX,
        str_bytes(record.database),
        str_bytes(record.table),
        long_bytes(record.table_id),
        long_bytes(record.commit_ts),
        long_bytes(record.lsn),
        *tail,
    ))


def encode_logtail(record: LogtailRecord) -> bytes:
    try:
        fast = _common(record)
    except UNFIT:
        fast = None  # a value that does not fit: the codec says what is wrong
    if fast is not None:
        return fast
    return encode_record(LOGTAIL, record_to_dict(record))


def decode_logtail(data: bytes) -> LogtailRecord:
    fast = _read_common(data)
    if fast is not None:
        return fast
    return record_from_dict(decode_record(data, expected=LOGTAIL)[1])


def record_to_dict(record: LogtailRecord) -> dict[str, Any]:
    """The ``logtail`` dict of a record, as the codec writes it."""
    return {
        "database": record.database,
        "table": record.table,
        "table_id": record.table_id,
        "commit_ts": record.commit_ts,
        "lsn": record.lsn,
        "body": _body_out(record.body),
    }


def record_from_dict(d: dict[str, Any]) -> LogtailRecord:
    """The inverse of `record_to_dict`."""
    name, body = d["body"]
    return LogtailRecord(
        d["database"], d["table"], d["commit_ts"], _body_in(name, body), d["table_id"], d["lsn"]
    )


def _read_common(data: bytes) -> LogtailRecord | None:
    """A Changes or Heartbeat record read field by field; None when `data` is not one or
    does not read cleanly to its end (the codec then judges it and raises its error)."""
    if not data.startswith(_PREFIX):
        return None
    try:
        database, pos = read_str(data, len(_PREFIX))
        table, pos = read_str(data, pos)
        table_id, pos = read_long(data, pos)
        commit_ts, pos = read_long(data, pos)
        lsn, pos = read_long(data, pos)
        branch, pos = data[pos : pos + 1], pos + 1
        body: Body
        if branch == _CHANGES:
            inserts, pos = read_optional_bytes(data, pos)
            deletes, pos = read_optional_bytes(data, pos)
            body = Changes(inserts, deletes)
        elif branch == _HEARTBEAT:
            body = Heartbeat()
        else:
            return None
    except (IndexError, ValueError):
        return None
    if pos != len(data):
        return None
    return LogtailRecord(database, table, commit_ts, body, table_id, lsn)
