"""An in-memory block: at most BLOCK_ROWS rows, as arrays (tn.memtable.columns).

Once flushed (`flush`: a checkpoint dumped every row it will ever hold), the arrays
give way to views over its objects (tn.memtable.flushed): no per-row Python object
stays in memory, and none was ever made (docs/memory.md).

Per row: the commit ts of the transaction that appended it (`cts`; MAX_TS while
uncommitted, ABORTED_TS after an abort) and its delete ts (`dts`; MAX_TS while
not deleted): the delete mask with timestamps, two int64 arrays of BLOCK_ROWS
preallocated at the first row; `cts` / `dts` are views of rows [0, len). A row is
visible at ts iff ``cts[i] <= ts < dts[i]``. Columns are keyed by column id (stable
across alter table); a column the block has not seen yet reads as nulls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from tn.catalog.nodes import ABORTED_TS, MAX_TS
from tn.memtable.columns import BLOCK_ROWS, Column, infer_type, new_column
from tn.memtable.flushed import DroppedCols, FlushedDts, FlushedTs, ObjectRows, loc_ts

__all__ = ["BLOCK_ROWS", "DroppedCols", "MemBlock"]

_NONE: Mapping[int, pa.DataType] = {}
_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY.flags.writeable = False


class MemBlock:
    __slots__ = ("cols", "_cts", "_dts", "n")

    def __init__(self) -> None:
        self.cols: dict[int, Any] = {}  # column id -> Column; DroppedCols once flushed
        # int64 arrays of BLOCK_ROWS (None until the first row); FlushedTs / FlushedDts
        # once flushed (same indexing)
        self._cts: Any = None
        self._dts: Any = None
        self.n = 0  # rows written; published last by a write (readers go by it)

    def __len__(self) -> int:
        return self.n

    def _rows(self, ts: Any) -> Any:
        """Rows [0, len) of a ts array (a writable view), or the flushed block's ts as is."""
        if ts is None:
            return _EMPTY
        return ts[: self.n] if isinstance(ts, np.ndarray) else ts

    @property
    def cts(self) -> Any:
        """Commit ts of rows [0, len): a view (writable: the pipeline sets them)."""
        return self._rows(self._cts)

    @property
    def dts(self) -> Any:
        """Delete ts of rows [0, len): a view (writable: deletes set them)."""
        return self._rows(self._dts)

    @property
    def free(self) -> int:
        return BLOCK_ROWS - self.n

    def _arrays(self) -> None:
        if self._cts is None:
            self._cts = np.full(BLOCK_ROWS, ABORTED_TS, dtype=np.int64)
            self._dts = np.full(BLOCK_ROWS, MAX_TS, dtype=np.int64)

    def column(
        self, cid: int, values: Any, types: Mapping[int, pa.DataType] | Callable[[int], Any]
    ) -> Column | None:
        """Column cid, made (all null so far) at its first value; None while it has none
        and its type is unknown."""
        col = self.cols.get(cid)
        if col is None:
            typ = types(cid) if callable(types) else types.get(cid)
            if typ is None:
                typ = infer_type(values)
                if typ is None:
                    return None
            col = self.cols[cid] = new_column(typ)
        return col

    def write(
        self,
        columns: Mapping[int, Any],
        src: int,
        n: int,
        cts: int,
        types: Mapping[int, pa.DataType] | Callable[[int], Any] = _NONE,
    ) -> int:
        """Append rows [src, src+n) of `columns` (column id -> Python values; `types`:
        column id -> Arrow type) with commit ts `cts`; returns the first row offset.
        The caller holds the table lock."""
        start = self.n
        if start + n > BLOCK_ROWS:
            raise ValueError(f"append beyond {BLOCK_ROWS} rows")
        self._arrays()
        self.put(start, columns, src, n, types)
        if n == 1:
            self._cts[start] = cts
            self._dts[start] = MAX_TS
        else:
            self._cts[start : start + n] = cts
            self._dts[start : start + n] = MAX_TS
        self.n = start + n  # last: readers see complete rows only
        return start

    def put(
        self,
        at: int,
        columns: Mapping[int, Any],
        src: int,
        n: int,
        types: Mapping[int, pa.DataType] | Callable[[int], Any] = _NONE,
    ) -> None:
        """Rows [at, at+n) of every column in `columns` (their ts are the caller's)."""
        cols = self.cols
        for cid, values in columns.items():
            col = cols.get(cid)
            if col is None:
                col = self.column(cid, values[src : src + n], types)
                if col is None:
                    continue  # nulls so far, type unknown: read as nulls
            col.put(at, values, src, n)

    def put_rows(
        self,
        rows: np.ndarray,
        columns: Mapping[int, Sequence[Any]],
        types: Mapping[int, pa.DataType] | Callable[[int], Any] = _NONE,
        ascending: bool | None = None,
    ) -> None:
        """Row rows[i] of every column in `columns` takes its values[i] (replay's bulk
        place; the rows' ts are the caller's). `ascending`: whether `rows` are consecutive
        and increasing, when the caller knows."""
        cols = self.cols
        for cid, values in columns.items():
            col = cols.get(cid)
            if col is None:
                col = self.column(cid, values, types)
                if col is None:
                    continue  # nulls so far, type unknown: read as nulls
            col.put_rows(rows, values, ascending)

    def pad(self, n: int, cts: int) -> None:
        """Append n placeholder rows (replay: rows of transactions that never committed)."""
        self.write({}, 0, n, cts)

    def set_cts(self, start: int, n: int, ts: int) -> None:
        c = self._cts
        if not isinstance(c, np.ndarray):
            raise TypeError("a flushed block's rows are final: its commit ts cannot change")
        if n == 1:
            c[start] = ts
        else:
            c[start : start + n] = ts

    def set_cts_rows(self, rows: np.ndarray, ts: np.ndarray) -> None:
        """Row rows[i] takes commit ts ts[i] (replay's bulk place)."""
        c = self._cts
        if not isinstance(c, np.ndarray):
            raise TypeError("a flushed block's rows are final: its commit ts cannot change")
        c[rows] = ts

    def load(self, cts: np.ndarray, dts: np.ndarray, cols: dict[int, Any]) -> None:
        """The block's rows from its objects (recovery of a block not complete at the
        checkpoint; compaction without an object reader): len(cts) rows."""
        n = len(cts)
        self._arrays()
        self._cts[:n] = cts
        self._dts[:n] = dts
        self.cols = cols
        self.n = n

    @property
    def flushed(self) -> bool:
        return isinstance(self._cts, FlushedTs)

    def running_row(self) -> int | None:
        """The first row of a transaction still running (commit ts MAX_TS), if any: while
        there is one, no object can hold every row the block will have."""
        cts = self._cts
        if not isinstance(cts, np.ndarray):
            return None  # no row yet, or flushed (every row final)
        running = np.flatnonzero(cts[: self.n] == MAX_TS)
        return int(running[0]) if len(running) else None

    def flush(
        self,
        reader: ObjectRows,
        loc: str,
        delta_loc: str,
        pk: int,
        override: int = 0,
        n: int | None = None,
    ) -> None:
        """Replace the rows in memory by views over the block's objects: `loc` holds
        every row the block will ever have (commit ts; `override` for every row when the
        object's were not final), `delta_loc` the deletes up to its ts; later deletes
        stay in memory until the next delta object. The caller holds whatever keeps the
        deletes of committing transactions off the block meanwhile (the pipeline's
        visibility lock)."""
        if self.flushed:
            return
        if n is None:
            n = self.n
        row = self.running_row()
        if row is not None:
            # the object cannot hold those rows, and their commit would find the block's
            # commit ts final (checked here, not found as lost rows)
            raise ValueError(f"cannot flush a block holding a running transaction's rows (row {row})")
        cts = np.asarray(self.cts[:n], dtype=np.int64)
        dts = np.asarray(self.dts[:n], dtype=np.int64)
        base = loc_ts(delta_loc)
        late = np.nonzero((dts != MAX_TS) & (dts > base))[0]
        recent = dict(zip(late.tolist(), dts[late].tolist(), strict=True))
        # counted when the rows are here; else (recovery) at the first need
        present = int((cts < ABORTED_TS).sum()) if len(cts) == n else -1
        # a full block's counts as the module's int objects, not new ones per block
        # (small objects that outlive the rows around them keep their pools)
        n = BLOCK_ROWS if n == BLOCK_ROWS else n
        present = BLOCK_ROWS if present == BLOCK_ROWS else present
        self.cols = DroppedCols(loc, pk_cid=pk, reader=reader, n=n)
        self._dts = FlushedDts(reader, delta_loc, n, recent)
        self._cts = FlushedTs(reader, loc, n, override, present)
        self.n = n

    def visible_mask(self, ts: int, n: int) -> np.ndarray:
        """Boolean mask of the first n rows: visible at ts. n must come from a consistent
        snapshot (`TableData.block_rows`)."""
        cts = np.asarray(self.cts[:n], dtype=np.int64)
        dts = np.asarray(self.dts[:n], dtype=np.int64)
        return (cts <= ts) & (dts > ts)

    def nbytes(self) -> int:
        """Bytes of the arrays the block holds in memory (0 once flushed)."""
        if not isinstance(self._cts, np.ndarray):
            return 0
        held = self._cts.nbytes + self._dts.nbytes
        for c in list(self.cols.values()):
            held += getattr(c, "nbytes", 0)
        return int(held)

    def arrays(self, n: int) -> dict[int, pa.Array]:
        """Rows [0, n) of the columns held in memory, as Arrow arrays by column id."""
        from tn.memtable.columns import column_arrays

        return column_arrays(self.cols, n)
