"""WAL entry records (seed 004, "WAL Practical"): one entry per write transaction.

    +-----+---------------------+-----------+-----------+-   -+
    | LSN | Transaction Context | Command-1 | Command-2 | ... |
    +-----+---------------------+-----------+-----------+-   -+

The WAL is physical: an Append names the exact block and row offset its rows
land on, a Delete names the block and row numbers, and every new catalog node
(database, table, segment, block) has its id in an UpdateCatalog command, so
replay rebuilds the same ids and offsets. Compact and merge are UpdateCatalog
commands only (old blocks get delete@, new blocks are created with a metaLoc).

These dataclasses are the in-memory form; `schemas.codec` turns them into the
versioned Avro envelope (`wal_entry.avsc`) and back. Timestamps are HLC values
(int64); 0 means "not set" (a live node's delete@).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class CatalogKind(StrEnum):
    DATABASE = "database"
    TABLE = "table"
    SEGMENT = "segment"
    BLOCK = "block"


class CatalogReason(StrEnum):
    """Why a catalog node changed; compact and merge are only catalog updates."""

    DDL = "ddl"  # create/drop database or table, alter table
    ALLOCATE = "allocate"  # a new segment/block created to hold appended rows
    FLUSH = "flush"  # a checkpoint recorded metaLoc/deltaLoc of a dumped block
    COMPACT = "compact"  # a block replaced by its sorted copy
    MERGE = "merge"  # a segment's blocks replaced by merged sorted blocks
    LARGE_TXN = "large_txn"  # a block a producer uploaded itself, committed as metadata


class ColumnType(StrEnum):
    INT64 = "int64"
    FLOAT64 = "float64"
    STRING = "string"
    BOOL = "bool"
    BINARY = "binary"
    TIMESTAMP = "timestamp"  # microseconds, UTC


@dataclass(frozen=True, slots=True)
class Dest:
    """Ids of a catalog node and its ancestors; 0 where a level does not apply."""

    db_id: int
    table_id: int = 0
    segment_id: int = 0
    block_id: int = 0


@dataclass(frozen=True, slots=True)
class ColumnDef:
    column_id: int  # stable across alter table; names may be reused after a drop
    name: str
    type: ColumnType
    nullable: bool = True


def columns_out(columns: Iterable[ColumnDef]) -> list[list[Any]]:
    """Columns as JSON rows `[column_id, name, type, nullable]`: the form checkpoints'
    catalog snapshots, the Spark job's progress and its decoding plans share."""
    return [[c.column_id, c.name, c.type.value, c.nullable] for c in columns]


def columns_in(rows: Iterable[Sequence[Any]]) -> tuple[ColumnDef, ...]:
    """`columns_out`'s inverse."""
    return tuple(ColumnDef(int(i), str(n), ColumnType(t), bool(nl)) for i, n, t, nl in rows)


@dataclass(frozen=True, slots=True)
class TableSchema:
    columns: tuple[ColumnDef, ...]
    primary_key: str
    version: int = 1  # bumped by every alter table

    def column(self, name: str) -> ColumnDef:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class EntryNode:
    """A catalog node's MVCC state: create@/delete@ plus per-kind payload."""

    create_ts: int
    delete_ts: int = 0
    name: str = ""  # database and table names
    meta_loc: str = ""  # segments and blocks: object holding the data
    delta_loc: str = ""  # segments and blocks: object holding deletes
    schema: TableSchema | None = None  # tables only


@dataclass(frozen=True, slots=True)
class UpdateCatalog:
    kind: CatalogKind
    dest: Dest
    node: EntryNode
    reason: CatalogReason = CatalogReason.DDL


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """Rows [src_offset, src_offset+src_length) of the batch land at
    rows [dest_offset, dest_offset+dest_length) of block `dest`."""

    src_offset: int
    src_length: int
    dest: Dest
    dest_offset: int
    dest_length: int


@dataclass(frozen=True, slots=True)
class Append:
    infos: tuple[AppendInfo, ...]
    batch: bytes  # Arrow IPC stream of the appended rows


@dataclass(frozen=True, slots=True)
class Delete:
    """All deletes of one transaction on one block."""

    dest: Dest
    rows: tuple[int, ...]


Command = UpdateCatalog | Append | Delete


@dataclass(frozen=True, slots=True)
class TxnContext:
    start_ts: int
    commit_ts: int
    memo: tuple[Dest, ...] = ()  # blocks the transaction touched (for checkpoints)


@dataclass(frozen=True, slots=True)
class WalEntry:
    lsn: int
    txn: TxnContext
    commands: tuple[Command, ...] = field(default_factory=tuple)
