"""Hypothesis strategies for WAL entries and Arrow batches (reusable by other suites)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

from schemas.arrow_ipc import table_to_ipc
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

INT64 = st.integers(-(2**63), 2**63 - 1)
IDS = st.integers(0, 2**63 - 1)
TS = st.one_of(st.just(0), st.integers(1, 2**63 - 1))
SMALL = st.integers(0, 8192)
NAMES = st.text(max_size=12)
LOCS = st.one_of(st.just(""), st.text(min_size=1, max_size=40))

ARROW_TYPES: dict[ColumnType, pa.DataType] = {
    ColumnType.INT64: pa.int64(),
    ColumnType.FLOAT64: pa.float64(),
    ColumnType.STRING: pa.string(),
    ColumnType.BOOL: pa.bool_(),
    ColumnType.BINARY: pa.binary(),
    ColumnType.TIMESTAMP: pa.timestamp("us", tz="UTC"),
}

VALUES: dict[ColumnType, st.SearchStrategy[Any]] = {
    ColumnType.INT64: INT64,
    ColumnType.FLOAT64: st.floats(allow_nan=False),  # NaN != NaN would break table equality
    ColumnType.STRING: st.text(max_size=16),
    ColumnType.BOOL: st.booleans(),
    ColumnType.BINARY: st.binary(max_size=16),
    ColumnType.TIMESTAMP: st.datetimes(
        min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ),
}

dests = st.builds(Dest, IDS, IDS, IDS, IDS)
column_types = st.sampled_from(list(ColumnType))


@st.composite
def table_schemas(draw: st.DrawFn) -> TableSchema:
    names = draw(st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=6, unique=True))
    columns = tuple(
        ColumnDef(draw(IDS), name, draw(column_types), draw(st.booleans())) for name in names
    )
    return TableSchema(columns, primary_key=draw(st.sampled_from(names)), version=draw(st.integers(1, 2**31)))


@st.composite
def arrow_tables(draw: st.DrawFn, schema: TableSchema | None = None, max_rows: int = 20) -> pa.Table:
    """A random table whose columns follow `schema` (random when None); nullable
    columns get nulls."""
    schema = schema if schema is not None else draw(table_schemas())
    n = draw(st.integers(0, max_rows))
    arrays = []
    for c in schema.columns:
        values = VALUES[c.type]
        if c.nullable:
            values = st.one_of(st.none(), values)
        arrays.append(pa.array(draw(st.lists(values, min_size=n, max_size=n)), ARROW_TYPES[c.type]))
    fields = [pa.field(c.name, ARROW_TYPES[c.type], nullable=c.nullable) for c in schema.columns]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


entry_nodes = st.builds(
    EntryNode,
    create_ts=TS,
    delete_ts=TS,
    name=NAMES,
    meta_loc=LOCS,
    delta_loc=LOCS,
    schema=st.one_of(st.none(), table_schemas()),
)

update_catalogs = st.builds(
    UpdateCatalog,
    kind=st.sampled_from(list(CatalogKind)),
    dest=dests,
    node=entry_nodes,
    reason=st.sampled_from(list(CatalogReason)),
)

deletes = st.builds(Delete, dests, st.lists(st.integers(0, 8191), max_size=50).map(tuple))


@st.composite
def appends(draw: st.DrawFn) -> Append:
    """An Append whose batch is a real Arrow IPC stream and whose infos cover it."""
    table = draw(arrow_tables())
    infos: list[AppendInfo] = []
    offset = 0
    while offset < table.num_rows:
        length = draw(st.integers(1, table.num_rows - offset))
        infos.append(AppendInfo(offset, length, draw(dests), draw(SMALL), length))
        offset += length
    return Append(tuple(infos), table_to_ipc(table))


commands: st.SearchStrategy[Command] = st.one_of(update_catalogs, appends(), deletes)

txn_contexts = st.builds(TxnContext, TS, TS, st.lists(dests, max_size=5).map(tuple))

wal_entries = st.builds(
    WalEntry,
    lsn=st.integers(1, 2**63 - 1),
    txn=txn_contexts,
    commands=st.lists(commands, max_size=5).map(tuple),
)
