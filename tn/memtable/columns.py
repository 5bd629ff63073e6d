"""A block's columns in memory as arrays: no Python object per value (issue 33).

A transaction's rows arrive as Python lists, or as Arrow arrays for a big batch
(tn.txn.rows.Batch); `put` copies them into arrays preallocated for a block's rows,
and `arrow` hands rows [0, n) to readers as an Arrow array (zero copy where the layout
allows). Per column:

- fixed width (int64, float64, bool, timestamp): a numpy array of BLOCK_ROWS values;
- variable width (string, binary): the values' bytes in one growing buffer, with each
  row's start and length (Arrow-style offsets are made at read time: rows may be
  written out of order by replay's `place`, into placeholders);
- both: a validity array; a row never written (a placeholder, a column added after
  the row, a column the write did not carry) reads as null.

Why arrays: Python's small-object allocator keeps the arenas of the largest working
set the TN ever had (docs/memory.md "RSS and the allocators"); values held as Python
ints and strs made the TN's RSS follow that, and the cyclic collector walk the lists.

Rows [0, n) of a column never change once the block's row count says n (the writer
holds the table lock and publishes n last), except through replay's `place` (before
the TN serves), so readers read them without the lock.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any, overload

import numpy as np
import pyarrow as pa

from tn.exceptions import ValidationError

BLOCK_ROWS = 8192

_TS_TYPE = pa.timestamp("us", tz="UTC")
_FIXED: dict[pa.DataType, np.dtype[Any]] = {
    pa.int64(): np.dtype(np.int64),
    pa.float64(): np.dtype(np.float64),
    pa.bool_(): np.dtype(np.bool_),
}


def _bitmap(valid: np.ndarray) -> pa.Buffer | None:
    """Arrow's validity bitmap of `valid` (None: no null)."""
    if valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _slice_values(arrow: Callable[[int], pa.Array], i: slice, length: int) -> list[Any]:
    """Rows `i` (step 1) of a column of `length` rows as Python values (None: null), from
    its Arrow view of the first rows (`arrow(n)`)."""
    start, stop, step = i.indices(length)
    if step != 1:
        raise ValueError("column slices take step 1")
    values: list[Any] = arrow(stop).slice(start).to_pylist()
    return values


class FixedColumn:
    """A fixed-width column: `data` and `valid`, BLOCK_ROWS each."""

    __slots__ = ("type", "data", "valid")

    def __init__(self, typ: pa.DataType, cap: int = BLOCK_ROWS) -> None:
        self.type = typ
        self.data = np.zeros(cap, dtype=_FIXED[typ])
        self.valid = np.zeros(cap, dtype=np.bool_)

    def __len__(self) -> int:
        """The rows the column can hold (not the block's row count)."""
        return len(self.data)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + self.valid.nbytes)

    def put(self, at: int, values: Sequence[Any] | pa.Array, src: int, n: int) -> None:
        """Rows [at, at+n) take values[src:src+n] (None: null; an Arrow array: its nulls)."""
        if isinstance(values, pa.Array):
            self._put_arrow(slice(at, at + n), values.slice(src, n))
            return
        if n == 1:
            v = values[src]
            if v is None:
                self.valid[at] = False
            else:
                self.data[at] = v
                self.valid[at] = True
            return
        part = values[src : src + n] if src or n != len(values) else values
        self._store(slice(at, at + n), part, n)

    def put_rows(
        self, rows: np.ndarray, values: Sequence[Any], ascending: bool | None = None
    ) -> None:
        """Row rows[i] takes values[i] (replay's bulk `TableData.place_rows`)."""
        self._store(rows, values, len(rows))

    def _store(self, at: slice | np.ndarray, part: Sequence[Any], n: int) -> None:
        data = self.data
        kind = data.dtype.kind
        try:
            if kind == "b" and None in part:  # numpy reads None as False
                raise TypeError
            data[at] = part  # int64: None raises; float64: None reads as NaN
            if kind != "f" or not np.isnan(data[at]).any():
                self.valid[at] = True
                return
        except TypeError:
            pass
        # nulls (or NaNs: told apart from nulls here, value by value)
        data[at] = [0 if v is None else v for v in part]
        self.valid[at] = np.fromiter((v is not None for v in part), np.bool_, n)

    def _put_arrow(self, at: slice, arr: pa.Array) -> None:
        """Rows `at` take an Arrow array of the column's type: no Python value per row
        (a columnar `tn.txn.rows.Batch`)."""
        if arr.type != self.type:
            arr = arr.cast(self.type)
        if arr.null_count:
            fill = pa.scalar(False if self.data.dtype.kind == "b" else 0, arr.type)
            self.data[at] = arr.fill_null(fill).to_numpy(zero_copy_only=False)
            self.valid[at] = arr.is_valid().to_numpy(zero_copy_only=False)
        else:
            self.data[at] = arr.to_numpy(zero_copy_only=False)
            self.valid[at] = True

    def arrow(self, n: int) -> pa.Array:
        """Rows [0, n) as an Arrow array of the column's type."""
        return pa.Array.from_buffers(
            self.type, n, [_bitmap(self.valid[:n]), self._buffer(n)]
        )

    def _buffer(self, n: int) -> pa.Buffer:
        if self.data.dtype == np.bool_:
            return pa.py_buffer(np.packbits(self.data[:n], bitorder="little"))
        return pa.py_buffer(self.data[:n])

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...

    def __getitem__(self, i: int | slice) -> Any:
        """A row's Python value (None: null); a slice: a list of them."""
        if isinstance(i, slice):
            return _slice_values(self.arrow, i, len(self.data))
        if not self.valid[i]:
            return None
        return self.data[i].item()


class TimestampColumn(FixedColumn):
    """Microseconds since the epoch (UTC) in an int64 array; values in and out are
    datetimes, as Arrow's to_pylist gives them."""

    __slots__ = ()

    def __init__(self, typ: pa.DataType = _TS_TYPE, cap: int = BLOCK_ROWS) -> None:
        self.type = typ
        self.data = np.zeros(cap, dtype=np.int64)
        self.valid = np.zeros(cap, dtype=np.bool_)

    def put(self, at: int, values: Sequence[Any] | pa.Array, src: int, n: int) -> None:
        if isinstance(values, pa.Array):
            self._put_arrow(slice(at, at + n), values.slice(src, n))
            return
        self._store(slice(at, at + n), values[src : src + n], n)

    def _store(self, at: slice | np.ndarray, part: Sequence[Any], n: int) -> None:
        self._put_arrow(at, pa.array(list(part), type=self.type))

    def _put_arrow(self, at: slice | np.ndarray, arr: pa.Array) -> None:
        if arr.type != self.type:
            arr = arr.cast(self.type)
        self.data[at] = arr.cast(pa.int64()).fill_null(0).to_numpy()
        self.valid[at] = arr.is_valid().to_numpy(zero_copy_only=False)

    def _buffer(self, n: int) -> pa.Buffer:
        return pa.py_buffer(self.data[:n])

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return FixedColumn.__getitem__(self, i)
        if not self.valid[i]:
            return None
        return self.arrow(i + 1)[i].as_py()


class VarColumn:
    """A string or binary column: the values' bytes in `buf` (grown by doubling; a
    reader's reference to an older buffer stays valid), each row's `starts` / `lens`.
    `ordered`: every row was written after the rows before it, so the bytes are in row
    order and an Arrow array is made without copying them."""

    __slots__ = ("type", "is_str", "buf", "used", "starts", "lens", "valid", "top", "ordered")

    def __init__(self, typ: pa.DataType, cap: int = BLOCK_ROWS) -> None:
        self.type = typ
        self.is_str = pa.types.is_string(typ)
        self.buf = np.zeros(0, dtype=np.uint8)
        self.used = 0
        self.starts = np.zeros(cap, dtype=np.int64)
        self.lens = np.zeros(cap, dtype=np.int64)
        self.valid = np.zeros(cap, dtype=np.bool_)
        self.top = 0  # one past the highest row written
        self.ordered = True

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def nbytes(self) -> int:
        return int(self.buf.nbytes + self.starts.nbytes + self.lens.nbytes + self.valid.nbytes)

    def _encode(self, v: Any) -> bytes:
        if not self.is_str:
            return bytes(v)
        try:
            b: bytes = v.encode()
        except UnicodeEncodeError as e:
            raise ValidationError("type_mismatch", f"string {v!r} is not valid UTF-8: {e}") from None
        return b

    def _reserve(self, size: int) -> int:
        """Room for `size` more bytes; returns where they go."""
        at = self.used
        if at + size > len(self.buf):
            grown = np.empty(max(2 * len(self.buf), at + size, 4096), dtype=np.uint8)
            grown[:at] = self.buf[:at]
            self.buf = grown  # readers holding the old buffer still read their rows
        self.used = at + size
        return at

    def put_rows(
        self, rows: np.ndarray, values: Sequence[Any], ascending: bool | None = None
    ) -> None:
        """Row rows[i] takes values[i] (replay's bulk `TableData.place_rows`). `ascending`:
        whether `rows` are consecutive and increasing (None: find out)."""
        n = len(rows)
        if not n:
            return
        first = int(rows[0])
        if ascending is None:
            ascending = n == 1 or bool((np.diff(rows) == 1).all())
        if first < self.top or not ascending:
            self.ordered = False  # bytes out of row order
        self._store(rows, values, n)
        self.top = max(self.top, first + n if ascending else int(rows.max()) + 1)

    def put(self, at: int, values: Sequence[Any] | pa.Array, src: int, n: int) -> None:
        if at < self.top:
            self.ordered = False  # replay filled a placeholder: bytes out of row order
        if isinstance(values, pa.Array):
            self._put_arrow(slice(at, at + n), values.slice(src, n))
            self.top = max(self.top, at + n)
            return
        if n == 1:
            v = values[src]
            if v is None:
                self.valid[at] = False
                self.lens[at] = 0
            else:
                b = self._encode(v)
                pos = self._reserve(len(b))
                self.buf[pos : pos + len(b)] = np.frombuffer(b, np.uint8)
                self.starts[at] = pos
                self.lens[at] = len(b)
                self.valid[at] = True
            self.top = max(self.top, at + 1)
            return
        part = values[src : src + n] if src or n != len(values) else values
        self._store(slice(at, at + n), part, n)
        self.top = max(self.top, at + n)

    def _store(self, at: slice | np.ndarray, part: Sequence[Any], n: int) -> None:
        """Rows `at` (n of them) take `part`, their bytes appended in that order."""
        data = None
        if self.is_str:
            try:
                text = "".join(part)  # None (a null) raises
                data = text.encode()
            except (TypeError, UnicodeEncodeError):
                pass
            else:
                if len(data) == len(text):  # ASCII: a character is a byte
                    lens = np.fromiter(map(len, part), np.int64, n)
                else:
                    lens = np.fromiter((len(v.encode()) for v in part), np.int64, n)
                valid: Any = True
        if data is None:
            enc = [b"" if v is None else self._encode(v) for v in part]
            lens = np.fromiter(map(len, enc), np.int64, n)
            data = b"".join(enc)
            valid = np.fromiter((v is not None for v in part), np.bool_, n)
        pos = self._reserve(len(data))
        self.buf[pos : pos + len(data)] = np.frombuffer(data, np.uint8)
        ends = np.cumsum(lens)
        self.starts[at] = pos + ends - lens
        self.lens[at] = lens
        self.valid[at] = valid

    def _put_arrow(self, at: slice, arr: pa.Array) -> None:
        """Rows `at` take a string or binary Arrow array: its bytes copied as they are,
        its offsets as the rows' starts and lengths (no Python value per row)."""
        if arr.type != self.type:
            arr = arr.cast(self.type)
        n = len(arr)
        bufs = arr.buffers()
        offs = np.frombuffer(bufs[1], dtype=np.int32, count=arr.offset + n + 1)[arr.offset :]
        lo, hi = int(offs[0]), int(offs[-1])
        pos = self._reserve(hi - lo)
        if hi > lo:
            self.buf[pos : pos + hi - lo] = np.frombuffer(bufs[2], dtype=np.uint8, count=hi)[lo:]
        lens = np.diff(offs).astype(np.int64)
        self.starts[at] = pos + (offs[:-1].astype(np.int64) - lo)
        self.lens[at] = lens
        self.valid[at] = arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else True

    def arrow(self, n: int) -> pa.Array:
        buf = self.buf  # after n: it holds every row below n (module doc)
        lens = self.lens[:n]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        total = int(offsets[n])
        if self.ordered:
            data = buf[:total]
        else:  # gather each row's bytes into row order
            shift = np.repeat(self.starts[:n] - offsets[:-1], lens)
            data = buf[shift + np.arange(total, dtype=np.int64)]
        large = pa.large_string() if self.is_str else pa.large_binary()
        arr = pa.Array.from_buffers(
            large, n, [_bitmap(self.valid[:n]), pa.py_buffer(offsets), pa.py_buffer(data)]
        )
        return arr.cast(self.type)

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return _slice_values(self.arrow, i, len(self.starts))
        if not self.valid[i]:
            return None
        s = int(self.starts[i])
        raw = self.buf[s : s + int(self.lens[i])].tobytes()
        return raw.decode() if self.is_str else raw


Column = FixedColumn | VarColumn


def new_column(typ: pa.DataType) -> Column:
    """An empty column of Arrow type `typ` (the types of schemas.arrow_ipc.ARROW_TYPES)."""
    if typ in _FIXED:
        return FixedColumn(typ)
    if pa.types.is_timestamp(typ):
        return TimestampColumn(typ)
    if pa.types.is_string(typ) or pa.types.is_binary(typ):
        return VarColumn(typ)
    raise ValueError(f"no in-memory column for type {typ}")


def infer_type(values: Sequence[Any] | pa.Array) -> pa.DataType | None:
    """The Arrow type of the first non-null value (a column the table's schemas do not
    name); None when every value is null."""
    if isinstance(values, pa.Array):
        return None if values.null_count == len(values) else values.type
    for v in values:
        if v is None:
            continue
        if isinstance(v, bool):
            return pa.bool_()
        if isinstance(v, int):
            return pa.int64()
        if isinstance(v, float):
            return pa.float64()
        if isinstance(v, str):
            return pa.string()
        if isinstance(v, (bytes, bytearray, memoryview)):
            return pa.binary()
        if isinstance(v, _dt.datetime):
            return _TS_TYPE
        raise ValueError(f"no in-memory column for a value of type {type(v).__name__}")
    return None


def column_arrays(cols: Mapping[int, Any], n: int) -> dict[int, pa.Array]:
    """Rows [0, n) of each column (arrays, or the lists a block without an object reader
    keeps: tn.checkpoint.runner.drop_block_memory), as Arrow arrays."""
    out: dict[int, pa.Array] = {}
    for cid, c in cols.items():
        if isinstance(c, (FixedColumn, VarColumn)):
            out[cid] = c.arrow(n)
        else:
            out[cid] = pa.array(list(c[:n]))
    return out
