"""An in-memory block: at most BLOCK_ROWS rows in columnar Python lists.

Per row: the commit ts of the transaction that appended it (`cts`; MAX_TS while
uncommitted, ABORTED_TS after an abort) and its delete ts (`dts`; MAX_TS while
not deleted): the delete mask with timestamps. A row is visible at ts iff
``cts[i] <= ts < dts[i]``. Columns are keyed by column id (stable across alter
table); a column the block has not seen yet reads as nulls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tn.catalog.nodes import MAX_TS

BLOCK_ROWS = 8192


class DroppedCols(dict[int, list[Any]]):
    """`MemBlock.cols` of a block whose rows were dumped to object storage and dropped
    from memory (tn.checkpoint): only the primary-key column stays (deletes and replay
    need the key of a row); readers load the other columns from `loc`. A full block only
    (no more appends), so `cts`/`dts` stay exact in memory."""

    __slots__ = ("loc",)

    def __init__(self, loc: str, pk: dict[int, list[Any]]) -> None:
        super().__init__(pk)
        self.loc = loc


class MemBlock:
    __slots__ = ("cols", "cts", "dts")

    def __init__(self) -> None:
        self.cols: dict[int, list[Any]] = {}
        self.cts: list[int] = []
        self.dts: list[int] = []

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

    def visible_mask(self, ts: int, n: int) -> np.ndarray:
        """Boolean mask of the first n rows: visible at ts. n must come from a consistent
        snapshot (`TableData.block_rows`): `write` extends cts and dts one after the other."""
        cts = np.array(self.cts[:n], dtype=np.int64)
        dts = np.array(self.dts[:n], dtype=np.int64)
        return (cts <= ts) & (dts > ts)
