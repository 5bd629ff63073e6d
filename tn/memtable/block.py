"""An in-memory block: at most BLOCK_ROWS rows in columnar Python lists.

Once flushed (`flush`: a checkpoint dumped every row it will ever hold), the lists
give way to views over its objects (tn.memtable.flushed): no per-row Python object
stays in memory.

Per row: the commit ts of the transaction that appended it (`cts`; MAX_TS while
uncommitted, ABORTED_TS after an abort) and its delete ts (`dts`; MAX_TS while
not deleted): the delete mask with timestamps. A row is visible at ts iff
``cts[i] <= ts < dts[i]``. Columns are keyed by column id (stable across alter
table); a column the block has not seen yet reads as nulls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tn.catalog.nodes import ABORTED_TS, MAX_TS
from tn.memtable.flushed import DroppedCols, FlushedDts, FlushedTs, ObjectRows, loc_ts

__all__ = ["BLOCK_ROWS", "DroppedCols", "MemBlock"]

BLOCK_ROWS = 8192


class MemBlock:
    __slots__ = ("cols", "cts", "dts")

    def __init__(self) -> None:
        self.cols: dict[int, list[Any]] = {}
        # lists while in memory; FlushedTs / FlushedDts once flushed (same indexing)
        self.cts: Any = []
        self.dts: Any = []

    def __len__(self) -> int:
        return len(self.cts)

    @property
    def free(self) -> int:
        return BLOCK_ROWS - len(self.cts)

    def write(self, columns: dict[int, list[Any]], src: int, n: int, cts: int) -> int:
        """Append rows [src, src+n) of `columns` with commit ts `cts`; returns the first row
        offset. The caller holds the table lock."""
        start = len(self.cts)
        cols = self.cols
        for cid, values in columns.items():
            col = cols.get(cid)
            if col is None:
                col = cols[cid] = [None] * start
            if n == 1:
                col.append(values[src])
            else:
                col.extend(values[src : src + n])
        if len(columns) != len(cols):
            pad = [None] * n
            for cid, col in cols.items():
                if cid not in columns:
                    col.extend(pad)
        if n == 1:
            self.cts.append(cts)
            self.dts.append(MAX_TS)
        else:
            self.cts.extend([cts] * n)
            self.dts.extend([MAX_TS] * n)
        return start

    def pad(self, n: int, cts: int) -> None:
        """Append n placeholder rows (replay: rows of transactions that never committed)."""
        self.write({}, 0, n, cts)

    def set_cts(self, start: int, n: int, ts: int) -> None:
        if n == 1:
            self.cts[start] = ts
        else:
            self.cts[start : start + n] = [ts] * n

    @property
    def flushed(self) -> bool:
        return isinstance(self.cts, FlushedTs)

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
            n = len(self.cts)
        cts = np.asarray(self.cts[:n], dtype=np.int64) if n else np.zeros(0, np.int64)
        dts = np.asarray(self.dts[:n], dtype=np.int64) if n else np.zeros(0, np.int64)
        base = loc_ts(delta_loc)
        late = np.nonzero((dts != MAX_TS) & (dts > base))[0]
        recent = dict(zip(late.tolist(), dts[late].tolist(), strict=True))
        # counted when the rows are here; else (recovery) at the first need
        present = int((cts < ABORTED_TS).sum()) if len(cts) == n else -1
        # a full block's counts as the module's int objects, not new ones per block
        # (small objects that outlive the rows around them keep their pools)
        n = BLOCK_ROWS if n == BLOCK_ROWS else n
        present = BLOCK_ROWS if present == BLOCK_ROWS else present
        self.cts = FlushedTs(reader, loc, n, override, present)
        self.dts = FlushedDts(reader, delta_loc, n, recent)
        self.cols = DroppedCols(loc, pk_cid=pk, reader=reader, n=n)

    def visible_mask(self, ts: int, n: int) -> np.ndarray:
        """Boolean mask of the first n rows: visible at ts. n must come from a consistent
        snapshot (`TableData.block_rows`): `write` extends cts and dts one after the other."""
        cts = np.array(self.cts[:n], dtype=np.int64)
        dts = np.array(self.dts[:n], dtype=np.int64)
        return (cts <= ts) & (dts > ts)
