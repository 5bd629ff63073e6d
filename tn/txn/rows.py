"""Turning user rows (an Arrow table or a list of dicts) into a validated batch."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import pyarrow as pa

from schemas.arrow_ipc import ARROW_TYPES
from schemas.wal import ColumnDef, ColumnType, TableSchema
from tn.exceptions import ValidationError

_ARROW_ERRORS = (
    pa.ArrowInvalid,
    pa.ArrowTypeError,
    pa.ArrowNotImplementedError,
    TypeError,
    ValueError,
    OverflowError,
)

# Keyed by id(): hashing a TableSchema (a tuple of dataclasses) on every call costs
# more than the lookup; the entry holds the schema itself, so its id stays unique.
_schema_cache: dict[int, tuple[TableSchema, pa.Schema]] = {}


def arrow_schema(schema: TableSchema) -> pa.Schema:
    e = _schema_cache.get(id(schema))
    if e is None or e[0] is not schema:
        s = pa.schema([pa.field(c.name, ARROW_TYPES[c.type]) for c in schema.columns])
        if len(_schema_cache) > 4096:
            _schema_cache.clear()
        _schema_cache[id(schema)] = (schema, s)
        return s
    return e[1]


def column_type(value: Any) -> ColumnType:
    raw = getattr(value, "value", value)
    try:
        return ColumnType(raw)
    except ValueError:
        raise ValidationError("bad_column", f"unknown column type {raw!r}") from None


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _fast_ok(t: ColumnType, values: list[Any], nullable: bool) -> bool:
    """Whether `values` are already canonical Python values of type t (no conversion needed)."""
    if t is ColumnType.INT64:
        for v in values:
            if v is None:
                if not nullable:
                    return False
            elif type(v) is not int or not _INT64_MIN <= v <= _INT64_MAX:
                return False
    elif t is ColumnType.STRING:
        for v in values:
            if type(v) is not str and (v is not None or not nullable):
                return False
    elif t is ColumnType.FLOAT64:
        for v in values:
            if type(v) is not float and (v is not None or not nullable):
                return False
    elif t is ColumnType.BOOL:
        for v in values:
            if type(v) is not bool and (v is not None or not nullable):
                return False
    elif t is ColumnType.BINARY:
        for v in values:
            if type(v) is not bytes and (v is not None or not nullable):
                return False
    else:
        return False
    return True


def _convert(c: ColumnDef, values: list[Any]) -> list[Any]:
    """Strictly convert Python values to the canonical values of column c (no lossy casts)."""
    t = c.type
    out: list[Any] = []
    try:
        if t is ColumnType.TIMESTAMP:
            out = pa.array(values, type=ARROW_TYPES[t]).to_pylist()
        else:
            for v in values:
                if v is None:
                    pass
                elif t is ColumnType.INT64:
                    if isinstance(v, (bool, float)):
                        raise TypeError(f"{v!r} is not an integer")
                    v = operator.index(v)
                    if not _INT64_MIN <= v <= _INT64_MAX:
                        raise OverflowError(f"{v} out of int64 range")
                elif t is ColumnType.FLOAT64:
                    if isinstance(v, (bool, str, bytes)):
                        raise TypeError(f"{v!r} is not a number")
                    v = float(v)
                elif t is ColumnType.STRING:
                    if not isinstance(v, str):
                        raise TypeError(f"{v!r} is not a string")
                    v = str(v)
                elif t is ColumnType.BOOL:
                    if type(v).__name__ not in ("bool", "bool_"):
                        raise TypeError(f"{v!r} is not a bool")
                    v = bool(v)
                elif t is ColumnType.BINARY:
                    if not isinstance(v, (bytes, bytearray, memoryview)):
                        raise TypeError(f"{v!r} is not bytes")
                    v = bytes(v)
                out.append(v)
    except _ARROW_ERRORS as e:
        raise ValidationError("type_mismatch", f"column {c.name!r} ({t.value}): {e}") from None
    if not c.nullable and any(v is None for v in out):
        raise ValidationError("type_mismatch", f"null in non-nullable column {c.name!r}")
    return out


# An Arrow table of at least this many rows stays columnar in its `Batch` (no Python value
# per row: the memtable, the key checks and the WAL take its arrays); smaller ones become
# Python lists, which cost less than pyarrow's per-call overhead for a few rows.
COLUMNAR_MIN = 64


class Batch:
    """Validated rows: per schema column (schema order) either a Python list (`cols`) or,
    for an Arrow table of `COLUMNAR_MIN` rows or more, an Arrow array (`arrays`; `cols`
    then converts on first use), and the same rows as Arrow (built lazily from the lists,
    for the WAL's Append batch)."""

    __slots__ = ("schema", "_cols", "arrays", "n", "nbytes", "_arrow", "ipc", "_keys")

    def __init__(
        self,
        schema: TableSchema,
        cols: list[list[Any]] | None,
        n: int,
        nbytes: int,
        arrow: pa.Table | None,
        arrays: list[pa.Array] | None = None,
    ) -> None:
        self.schema = schema
        self._cols = cols
        self.arrays = arrays  # columnar: one Arrow array per schema column
        self.n = n
        self.nbytes = nbytes
        self._arrow = arrow
        self.ipc: bytes | None = None  # the Arrow IPC stream, set at commit
        self._keys: Any = None

    @property
    def cols(self) -> list[list[Any]]:
        if self._cols is None:
            assert self.arrays is not None
            self._cols = [a.to_pylist() for a in self.arrays]
        return self._cols

    @property
    def has_arrow(self) -> bool:
        return self._arrow is not None

    @property
    def columnar(self) -> bool:
        return self.arrays is not None

    def arrow(self) -> pa.Table:
        if self._arrow is None:
            rb = pa.RecordBatch.from_arrays(
                [
                    pa.array(col, type=f.type)
                    for col, f in zip(self.cols, arrow_schema(self.schema), strict=True)
                ],
                schema=arrow_schema(self.schema),
            )
            self._arrow = pa.Table.from_batches([rb])
        return self._arrow

    def by_column_id(self) -> dict[int, Any]:
        """column id -> the column's values (a list, or an Arrow array when columnar)."""
        cols = self.arrays if self.arrays is not None else self.cols
        return {c.column_id: col for c, col in zip(self.schema.columns, cols, strict=True)}

    def keys(self) -> Any:
        """The primary-key values: a list, or (columnar, int64 key) an int64 numpy array."""
        if self._keys is None:
            self._keys = self._key_values()
        return self._keys

    def _key_values(self) -> Any:
        for i, c in enumerate(self.schema.columns):
            if c.name == self.schema.primary_key:
                if self.arrays is None:
                    return self.cols[i]
                arr = self.arrays[i]
                if c.type is ColumnType.INT64:  # no nulls: checked when the batch was made
                    return arr.to_numpy(zero_copy_only=False)
                return arr.to_pylist()
        raise KeyError(self.schema.primary_key)


@dataclass(frozen=True, slots=True)
class Columns:
    """Rows given column by column: column name -> its values, every list as long (an
    absent nullable column is null). The TN writes its system tables' rows this way, a
    commit group's at once: no dict per row to build and to take apart again."""

    values: dict[str, list[Any]]


Rows: TypeAlias = pa.Table | Sequence[dict[str, Any]] | Columns


def to_batch(schema: TableSchema, rows: Rows | Batch) -> Batch:
    """Validate rows against the schema: exactly the schema's columns, in order (absent
    nullable columns are null), non-null primary key, values of the column types."""
    if isinstance(rows, Batch) and rows.schema is schema:
        return rows
    if isinstance(rows, Columns):
        return _from_columns(schema, rows.values)
    if not isinstance(rows, pa.Table):
        if isinstance(rows, dict) or not isinstance(rows, Sequence):
            raise ValidationError("bad_request", "rows must be an Arrow table or a list of dicts")
        names = arrow_schema(schema).names
        known = set(names)
        cols: list[list[Any]] = [[] for _ in names]
        appends = [c.append for c in cols]
        for row in rows:
            if not isinstance(row, dict):
                raise ValidationError("bad_request", "rows must be dicts")
            if len(row) > len(names) or not known.issuperset(row):
                unknown = [k for k in row if k not in known]
                raise ValidationError("bad_column", f"unknown columns {unknown}")
            for a, name in zip(appends, names, strict=True):
                a(row.get(name))
        return _checked(schema, cols, len(rows))
    return _from_arrow(schema, _conform(schema, rows))


def _from_columns(schema: TableSchema, values: dict[str, list[Any]]) -> Batch:
    names = arrow_schema(schema).names
    unknown = [k for k in values if k not in names]
    if unknown:
        raise ValidationError("bad_column", f"unknown columns {unknown}")
    if not all(isinstance(v, list) for v in values.values()):
        raise ValidationError("bad_request", "columns must be lists")
    lengths = {len(v) for v in values.values()}
    if len(lengths) > 1:
        raise ValidationError("bad_request", f"columns of different lengths {sorted(lengths)}")
    n = lengths.pop() if lengths else 0
    # copies: the batch's lists become the memtable's and the WAL's, not the caller's
    cols = [list(values[name]) if name in values else [None] * n for name in names]
    return _checked(schema, cols, n)


def _checked(schema: TableSchema, cols: list[list[Any]], n: int) -> Batch:
    """The batch of `n` rows given as Python columns in schema order: a non-null primary
    key, every value of its column's type (converted strictly where it is not already)."""
    pk_i = arrow_schema(schema).names.index(schema.primary_key)
    if any(k is None for k in cols[pk_i]):
        raise ValidationError(
            "missing_primary_key", f"null or missing primary key {schema.primary_key!r}"
        )
    for i, c in enumerate(schema.columns):
        if not _fast_ok(c.type, cols[i], c.nullable):
            cols[i] = _convert(c, cols[i])
    nbytes = 0
    for col in cols:
        for v in col:
            nbytes += len(v) if isinstance(v, (str, bytes)) else 8
    return Batch(schema, cols, n, nbytes, None)


def _conform(schema: TableSchema, rows: pa.Table) -> pa.Table:
    target = arrow_schema(schema)
    if rows.schema.equals(target):  # same names, order and types: nothing to do
        return rows
    names = set(target.names)
    unknown = [n for n in rows.column_names if n not in names]
    if unknown:
        raise ValidationError("bad_column", f"unknown columns {unknown}")
    if len(set(rows.column_names)) != len(rows.column_names):
        raise ValidationError("bad_column", "duplicate column names")
    if schema.primary_key not in rows.column_names:
        raise ValidationError(
            "missing_primary_key", f"primary key column {schema.primary_key!r} missing"
        )
    arrays = []
    for field in target:
        if field.name in rows.column_names:
            col = rows.column(field.name)
            if col.type != field.type:
                try:
                    col = col.cast(field.type, safe=True)
                except _ARROW_ERRORS as e:
                    raise ValidationError(
                        "type_mismatch",
                        f"column {field.name!r}: {col.type} is not {field.type}: {e}",
                    ) from None
            arrays.append(col)
        else:
            arrays.append(pa.nulls(rows.num_rows, field.type))
    return pa.Table.from_arrays(arrays, schema=target)


def _from_arrow(schema: TableSchema, table: pa.Table) -> Batch:
    pk = schema.primary_key
    if table.num_rows >= COLUMNAR_MIN:
        # columnar: the checks and the arrays without a Python value per row
        table = table.combine_chunks()
        arrays = [table.column(i).chunk(0) for i in range(table.num_columns)]
        for c, arr in zip(schema.columns, arrays, strict=True):
            if arr.null_count and (c.name == pk or not c.nullable):
                if c.name == pk:
                    raise ValidationError("missing_primary_key", f"null primary key {pk!r}")
                raise ValidationError("type_mismatch", f"null in non-nullable column {c.name!r}")
        return Batch(schema, None, table.num_rows, table.get_total_buffer_size(), table, arrays)
    # (checks on the Python values: cheaper than pyarrow calls for the usual tiny batches)
    cols = [table.column(i).to_pylist() for i in range(table.num_columns)]
    for c, col in zip(schema.columns, cols, strict=True):
        if c.name == pk:
            if None in col:
                raise ValidationError("missing_primary_key", f"null primary key {pk!r}")
        elif not c.nullable and None in col:
            raise ValidationError("type_mismatch", f"null in non-nullable column {c.name!r}")
    return Batch(schema, cols, table.num_rows, table.get_total_buffer_size(), table)


def key_list(schema: TableSchema, keys: Sequence[Any]) -> list[Any]:
    """Validate primary-key values for delete-by-key; returns them as Python values."""
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        keys = keys.to_pylist()
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise ValidationError("bad_request", "keys must be a list of primary-key values")
    t = ARROW_TYPES[schema.column(schema.primary_key).type]
    try:
        arr = pa.array(list(keys), type=t)
    except _ARROW_ERRORS as e:
        raise ValidationError("type_mismatch", f"primary key values: {e}") from None
    if arr.null_count:
        raise ValidationError("missing_primary_key", "null primary key")
    return arr.to_pylist()


def columns_of(schema: TableSchema, batch: pa.Table) -> dict[int, list[Any]]:
    """The batch's columns as Python lists keyed by column id (by name against `schema`)."""
    out: dict[int, list[Any]] = {}
    for name in batch.column_names:
        try:
            cdef: ColumnDef = schema.column(name)
        except KeyError:
            continue
        out[cdef.column_id] = batch.column(name).to_pylist()
    return out
