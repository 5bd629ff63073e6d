"""Collect a committed transaction's logtail from its WAL entry (seed 001, "收集").

The WAL entry already holds everything physical: the appended rows (Arrow
batch + where each slice landed) and the deleted row numbers per block. The
collector adds what a CN needs and the entry does not carry:

1. names: table id -> (database, table) from the catalog;
2. row ids: `block_id << 16 | offset` for every appended row;
3. primary keys of deleted rows, read from the memtable block they live in
   (the rows are still there: deletes only set a delete ts).

It returns one `Changes` record per (transaction, table), so a CN applies a
transaction on a table atomically and can drop a re-delivered one by LSN,
and `Catalog` records for DDL (drop database becomes drop_table of each of
its tables, so CNs need no database bookkeeping).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from schemas.arrow_ipc import ARROW_TYPES, ipc_to_table, table_to_ipc
from schemas.logtail import (
    COMMIT_TS,
    ROW_ID,
    BlockMeta,
    Catalog,
    CatalogOp,
    Changes,
    LogtailRecord,
    make_row_id,
)
from schemas.wal import (
    Append,
    CatalogKind,
    CatalogReason,
    Delete,
    TableSchema,
    UpdateCatalog,
    WalEntry,
)
from tn.catalog.nodes import SYSTEM_DB


@dataclass(frozen=True)
class TableInfo:
    database: str
    table: str
    schema: TableSchema


class CatalogView:
    """What the collector asks of the TN's catalog (an interface, so tests can feed it)."""

    def table(self, table_id: int, ts: int) -> TableInfo:
        raise NotImplementedError

    def database_name(self, db_id: int) -> str:
        raise NotImplementedError

    def tables_of(self, db_id: int, ts: int) -> list[tuple[int, str]]:
        """(table id, name) of the tables alive in the database just before ts."""
        raise NotImplementedError

    def primary_keys(self, block_id: int, rows: tuple[int, ...], table: TableInfo) -> list[object]:
        raise NotImplementedError


@dataclass
class _TableChanges:
    info: TableInfo
    table_id: int
    # (rows, the first one's row id): row ids are contiguous within each part
    inserts: list[tuple[pa.Table, int]] = field(default_factory=list)
    delete_ids: list[int] = field(default_factory=list)
    delete_keys: list[object] = field(default_factory=list)


def collect(entry: WalEntry, view: CatalogView) -> tuple[list[LogtailRecord], list[LogtailRecord]]:
    """(catalog records, table records) of one committed entry, in command order."""
    cts, lsn = entry.txn.commit_ts, entry.lsn
    catalog: list[LogtailRecord] = []
    tables: dict[int, _TableChanges] = {}

    system: set[int] = set()  # table ids of the TN's own tables: not pushed

    def changes_of(table_id: int) -> _TableChanges | None:
        if table_id in system:
            return None
        tc = tables.get(table_id)
        if tc is None:
            info = view.table(table_id, cts)
            if info.database == SYSTEM_DB:
                system.add(table_id)
                return None
            tc = tables[table_id] = _TableChanges(info, table_id)
        return tc

    blocks: list[LogtailRecord] = []  # a large transaction's blocks (rows in objects)
    for cmd in entry.commands:
        if isinstance(cmd, UpdateCatalog):
            if cmd.kind is CatalogKind.DATABASE or cmd.kind is CatalogKind.TABLE:
                if view.database_name(cmd.dest.db_id) != SYSTEM_DB:
                    catalog.extend(_catalog_records(cmd, cts, lsn, view))
            elif cmd.kind is CatalogKind.BLOCK and cmd.reason is CatalogReason.LARGE_TXN:
                tc = changes_of(cmd.dest.table_id)
                if tc is not None:
                    blocks.append(_large_block_record(cmd, tc, cts, lsn))
        elif isinstance(cmd, Append):
            if all(changes_of(i.dest.table_id) is None for i in cmd.infos):
                continue
            # No full validation: the batch is this TN's own encoding (live) or came out of
            # a checksummed log (republish after a restart); in one profile of `kwal bench
            # logtail` it took about a tenth of the publisher thread.
            batch = ipc_to_table(cmd.batch, validate=False)
            for info in cmd.infos:
                if info.src_length != info.dest_length:  # row ids count the rows moved
                    raise ValueError(
                        f"WAL entry {lsn}: an Append moves {info.src_length} rows "
                        f"into {info.dest_length}"
                    )
                target = changes_of(info.dest.table_id)
                if target is not None:
                    rows = batch.slice(info.src_offset, info.src_length)
                    target.inserts.append((rows, make_row_id(info.dest.block_id, info.dest_offset)))
        elif isinstance(cmd, Delete):
            tc = changes_of(cmd.dest.table_id)
            if tc is None:
                continue
            tc.delete_ids.extend(make_row_id(cmd.dest.block_id, r) for r in cmd.rows)
            tc.delete_keys.extend(view.primary_keys(cmd.dest.block_id, cmd.rows, tc.info))
    records = [_changes_record(tc, cts, lsn) for tc in tables.values() if tc.inserts or tc.delete_ids]
    return catalog, records + blocks


def _large_block_record(
    cmd: UpdateCatalog, tc: _TableChanges, cts: int, lsn: int
) -> LogtailRecord:
    """A block a large transaction committed with its rows in object storage: a BlockMeta
    created at the commit ts, in the transaction's place in the log (FORMAT.md 5, 7.7).
    Its rows never travel as `Changes`; a CN reads them from `meta_loc`."""
    meta = BlockMeta(cmd.dest.block_id, cmd.node.meta_loc, cts + 1, "", cts, 0)
    return LogtailRecord(tc.info.database, tc.info.table, cts, meta, tc.table_id, lsn)


_INT64 = pa.int64()
_ID_FIELDS = (pa.field(ROW_ID, _INT64), pa.field(COMMIT_TS, _INT64))


def _inserts_ipc(parts: list[tuple[pa.Table, int]], cts: int) -> bytes:
    """The rows a transaction appended to one table, with their row ids and commit ts in
    front (FORMAT.md: `__row_id`, `__commit_ts`, the table's columns), as Arrow IPC.

    Why the columns are put side by side once, not added one by one per part: this runs
    for every committed transaction on the publisher thread, and for the one-row
    transactions most commits are, each Arrow call is a few microseconds of fixed cost
    (and a chance for the committing threads to take the GIL away)."""
    if len(parts) == 1:
        rows, first = parts[0]
        ids = np.arange(first, first + rows.num_rows, dtype=np.int64)
    else:
        rows = pa.concat_tables([p for p, _ in parts], promote_options="default")
        ids = np.concatenate([np.arange(f, f + p.num_rows, dtype=np.int64) for p, f in parts])
    n, given = rows.num_rows, rows.schema
    schema = pa.schema([*_ID_FIELDS, *given], metadata=given.metadata)
    columns = [pa.array(ids, _INT64), pa.array(np.full(n, cts, dtype=np.int64), _INT64), *rows.columns]
    return table_to_ipc(pa.Table.from_arrays(columns, schema=schema))


def _changes_record(tc: _TableChanges, cts: int, lsn: int) -> LogtailRecord:
    inserts = deletes = None
    if tc.inserts:
        inserts = _inserts_ipc(tc.inserts, cts)
    if tc.delete_ids:
        pk = tc.info.schema.primary_key
        pk_type = ARROW_TYPES[tc.info.schema.column(pk).type]
        deletes = table_to_ipc(
            pa.table(
                {
                    ROW_ID: pa.array(tc.delete_ids, pa.int64()),
                    COMMIT_TS: pa.array([cts] * len(tc.delete_ids), pa.int64()),
                    pk: pa.array(tc.delete_keys, pk_type),
                }
            )
        )
    return LogtailRecord(
        tc.info.database, tc.info.table, cts, Changes(inserts, deletes), tc.table_id, lsn
    )


def _catalog_records(
    cmd: UpdateCatalog, cts: int, lsn: int, view: CatalogView
) -> list[LogtailRecord]:
    node = cmd.node
    if cmd.kind is CatalogKind.DATABASE:
        if node.delete_ts:
            dropped = view.tables_of(cmd.dest.db_id, cts)
            return [
                LogtailRecord(
                    node.name, name, cts, Catalog(CatalogOp.DROP_TABLE, cmd.dest.db_id), tid, lsn
                )
                for tid, name in dropped
            ] + [
                LogtailRecord(
                    node.name, "", cts, Catalog(CatalogOp.DROP_DATABASE, cmd.dest.db_id), 0, lsn
                )
            ]
        return [
            LogtailRecord(
                node.name, "", cts, Catalog(CatalogOp.CREATE_DATABASE, cmd.dest.db_id), 0, lsn
            )
        ]
    if cmd.kind is not CatalogKind.TABLE:
        return []  # segments/blocks: physical layout, not a CN's business until flushed
    database = view.database_name(cmd.dest.db_id)
    if node.delete_ts:
        op, schema = CatalogOp.DROP_TABLE, None
    elif node.create_ts == cts:
        op, schema = CatalogOp.CREATE_TABLE, node.schema
    else:
        op, schema = CatalogOp.ALTER_TABLE, node.schema
    return [
        LogtailRecord(
            database, node.name, cts, Catalog(op, cmd.dest.db_id, schema), cmd.dest.table_id, lsn
        )
    ]


CatalogViewFactory = Callable[[], CatalogView]
