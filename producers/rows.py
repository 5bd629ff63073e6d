"""A transaction's rows as an Arrow table (`to_arrow`), cheaply for a handful of rows.

Why not just `pa.Table.from_pylist`: for the one-row insert most transactions carry, its
type inference (`pa.array` over a Python list, ~9 us a column measured on this machine)
was the client's largest cost per commit (docs/perf-commit.md, "2026-11-27 (5)"). A column
whose values are all of one plain type -- `int` within int64, `float`, `str` -- is built
here straight from its buffers (~3 us), as the very array `pa.array` infers for it (int64,
double, string; no validity buffer). Any other column (None among the values, bools,
bytes, datetimes, ints beyond int64, mixed types) goes to pyarrow as before, through the
same `pa.Table.from_arrays` call that `from_pylist` and `pa.table` make: the same table,
the same errors.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from itertools import accumulate
from typing import Any, TypeAlias

import pyarrow as pa

Rows: TypeAlias = pa.Table | pa.RecordBatch | Sequence[Mapping[str, Any]] | Sequence[Sequence[Any]]

_INT64 = pa.int64()
_FLOAT64 = pa.float64()
_STRING = pa.string()
# string offsets are int32: a column with more UTF-8 bytes than this goes to pyarrow
_MAX_STRING_BYTES = (1 << 31) - 1


def _column(values: list[Any]) -> pa.Array | list[Any]:
    """`values` as the Arrow array `pa.array(values)` infers, built from its buffers when
    every value is an `int` (int64), a `float` (double) or a `str` (string); else the
    list itself, for `pa.Table.from_arrays` to convert as it always did."""
    first = type(values[0]) if values else None
    for v in values:
        if type(v) is not first:
            return values
    n = len(values)
    try:
        if first is int:
            data = pa.py_buffer(array("q", values))  # OverflowError beyond int64
            return pa.Array.from_buffers(_INT64, n, [None, data])
        if first is float:
            return pa.Array.from_buffers(_FLOAT64, n, [None, pa.py_buffer(array("d", values))])
        if first is str:
            encoded = [v.encode("utf-8") for v in values]  # UnicodeEncodeError: surrogates
            offsets = array("i", [0])
            offsets.extend(accumulate(len(b) for b in encoded))
            if offsets[-1] > _MAX_STRING_BYTES:
                return values
            return pa.Array.from_buffers(
                _STRING, n, [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
            )
    except (OverflowError, UnicodeEncodeError):
        pass
    return values


def to_arrow(rows: Rows, columns: Sequence[str] | None = None) -> pa.Table:
    """Rows as an Arrow table: an Arrow table/batch as is, a list of dicts (the columns
    of the first row, in its order; a later row's missing key is a null, as in
    `pa.Table.from_pylist`), or a list of lists/tuples whose column order `columns` gives."""
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pa.RecordBatch):
        return pa.Table.from_batches([rows])
    items: list[Any] = list(rows)
    if not items:
        return pa.table({c: pa.array([], pa.null()) for c in columns or ()})
    if isinstance(items[0], Mapping):
        dicts = [r if type(r) is dict else dict(r) for r in items]
        names = list(dicts[0])
        data = [[r[n] if n in r else None for r in dicts] for n in names]
        return pa.Table.from_arrays([_column(v) for v in data], names=names)
    if columns is None:
        raise ValueError("rows given as lists need columns=[...] naming their order")
    cols = list(columns)
    by_name: dict[str, list[Any]] = {c: [] for c in cols}
    for r in items:
        values = list(r)
        if len(values) != len(cols):
            raise ValueError(f"row {values!r} has {len(values)} values, expected {len(cols)}")
        for c, v in zip(cols, values, strict=True):
            by_name[c].append(v)
    return pa.Table.from_arrays([_column(v) for v in by_name.values()], names=list(by_name))
