"""A block's rows as arrays (tn/memtable/columns.py, block.py): what goes in reads back.

Nulls, columns added after rows exist (read as nulls), columns a write does not carry,
strings and binary (one byte buffer; rows placed out of order by replay), deletes,
aborts and replay's placeholders; and no Python object per value is kept.
"""

from __future__ import annotations

import datetime as dt
import gc
import itertools
import sys

import numpy as np
import pyarrow as pa
import pytest

from schemas.wal import ColumnDef, ColumnType, TableSchema
from tn.catalog.nodes import ABORTED_TS, MAX_TS, DatabaseNode, TableNode
from tn.memtable.block import BLOCK_ROWS, MemBlock
from tn.memtable.columns import FixedColumn, VarColumn
from tn.memtable.table import TableData

ID, NAME, SCORE, FLAG, RAW, AT = 1, 2, 3, 4, 5, 6
SCHEMA = TableSchema(
    (
        ColumnDef(ID, "id", ColumnType.INT64, False),
        ColumnDef(NAME, "name", ColumnType.STRING),
        ColumnDef(SCORE, "score", ColumnType.FLOAT64),
        ColumnDef(FLAG, "flag", ColumnType.BOOL),
        ColumnDef(RAW, "raw", ColumnType.BINARY),
        ColumnDef(AT, "at", ColumnType.TIMESTAMP),
    ),
    "id",
)
T0 = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)


def table_data(schema: TableSchema = SCHEMA) -> TableData:
    ids = itertools.count(100)
    td = TableData(lambda: next(ids))
    node = TableNode(10, DatabaseNode(1, "db"), "t", td)
    node.schemas.append((1, schema))
    td.table = node
    return td


def rows(lo: int, hi: int) -> dict[int, list[object]]:
    """Columns of rows lo..hi-1, with nulls in every nullable column (every 3rd row)."""
    ks = list(range(lo, hi))
    return {
        ID: ks,
        NAME: [None if k % 3 == 0 else f"n{k}-é" for k in ks],
        SCORE: [None if k % 3 == 1 else k / 4 for k in ks],
        FLAG: [None if k % 3 == 2 else k % 2 == 0 for k in ks],
        RAW: [None if k % 3 == 0 else bytes([k % 256]) * (k % 5) for k in ks],
        AT: [None if k % 3 == 1 else T0 + dt.timedelta(seconds=k) for k in ks],
    }


def expected(lo: int, hi: int) -> dict[int, list[object]]:
    return rows(lo, hi)


def read(mem: MemBlock, n: int | None = None) -> dict[int, list[object]]:
    n = len(mem) if n is None else n
    return {cid: arr.to_pylist() for cid, arr in mem.arrays(n).items()}


def test_every_type_with_nulls_reads_back_whole_and_by_row():
    td = table_data()
    one = rows(0, 1)
    td.append(one, 1, MAX_TS)  # the one-row path
    td.append(rows(1, 1000), 999, MAX_TS)  # the batch path
    for k in range(1000, 1010):
        td.append(rows(k, k + 1), 1, MAX_TS)
    (blk,) = td.blocks
    mem = blk.mem
    assert len(mem) == 1010
    got = read(mem)
    want = expected(0, 1010)
    assert got == want
    for cid, col in mem.cols.items():
        assert isinstance(col, (FixedColumn, VarColumn))
        assert [col[i] for i in (0, 1, 2, 500, 1009)] == [want[cid][i] for i in (0, 1, 2, 500, 1009)]
        assert col[3:7] == want[cid][3:7]
    types = {cid: arr.type for cid, arr in mem.arrays(10).items()}
    assert types[NAME] == pa.string() and types[RAW] == pa.binary()
    assert types[AT] == pa.timestamp("us", tz="UTC") and types[FLAG] == pa.bool_()
    assert mem.cts.tolist() == [MAX_TS] * 1010 and mem.dts.tolist() == [MAX_TS] * 1010
    assert all(type(v) is int for v in (mem.cols[ID][5], mem.cols[ID][6]))


def test_a_column_added_later_or_left_out_reads_as_nulls():
    td = table_data()
    td.append({ID: [1, 2], NAME: ["a", "b"]}, 2, MAX_TS)
    td.append({ID: [3], SCORE: [1.5]}, 1, MAX_TS)  # a column new to the block; name absent
    td.append({ID: [4, 5], NAME: ["d", None], SCORE: [None, 2.5]}, 2, MAX_TS)
    td.append({ID: [6, 7], NAME: [None, None], 99: [None, None]}, 2, MAX_TS)  # unknown, null
    mem = td.blocks[0].mem
    assert read(mem) == {
        ID: [1, 2, 3, 4, 5, 6, 7],
        NAME: ["a", "b", None, "d", None, None, None],
        SCORE: [None, None, 1.5, None, 2.5, None, None],
    }
    assert mem.cols.get(FLAG) is None  # never written: readers make nulls
    # a column the schemas do not name takes its values' type
    td.append({ID: [8], 77: ["x"]}, 1, MAX_TS)
    assert mem.cols[77][:8] == [None] * 7 + ["x"]


def test_strings_grow_their_buffer_and_older_reads_stay_valid():
    td = table_data()
    td.append({ID: [0], NAME: [""]}, 1, MAX_TS)  # empty is not null
    before = td.blocks[0].mem.arrays(1)[NAME]
    long = ["x" * 3000 + str(k) for k in range(1, 20)]  # grows the buffer several times
    td.append({ID: list(range(1, 20)), NAME: long}, 19, MAX_TS)
    for k in range(20, 40):
        td.append({ID: [k], NAME: ["ü" * k]}, 1, MAX_TS)
    mem = td.blocks[0].mem
    col = mem.cols[NAME]
    assert isinstance(col, VarColumn) and col.ordered
    assert before.to_pylist() == [""] and before.null_count == 0
    assert read(mem)[NAME] == [""] + long + ["ü" * k for k in range(20, 40)]
    assert col[25] == "ü" * 25


def test_replay_places_rows_out_of_order_into_placeholders():
    td = table_data()
    blk = td._new_block()
    # a later transaction's rows land first, beyond the end: rows 0-3 are placeholders
    td.place(blk, 4, rows(4, 8), 0, 4, 50, ABORTED_TS)
    assert len(blk.mem) == 8
    assert blk.mem.cts.tolist() == [ABORTED_TS] * 4 + [50] * 4
    td.place(blk, 0, rows(0, 4), 0, 4, 60, ABORTED_TS)  # into the placeholders
    assert not blk.mem.cols[NAME].ordered  # bytes out of row order: gathered on read
    assert read(blk.mem) == expected(0, 8)
    assert blk.mem.cts.tolist() == [60] * 4 + [50] * 4
    with pytest.raises(ValueError, match="row 2 is already taken"):
        td.place(blk, 2, rows(0, 1), 0, 1, 70, ABORTED_TS)
    with pytest.raises(ValueError, match="beyond"):
        td.place(blk, BLOCK_ROWS, rows(0, 1), 0, 1, 70, ABORTED_TS)


def test_deletes_aborts_and_visibility():
    td = table_data()
    ranges = td.append(rows(0, 10), 10, MAX_TS)
    ((blk, row0, _, n),) = ranges
    mem = blk.mem
    mem.set_cts(row0, 6, 5)  # rows 0-5 commit at 5
    mem.set_cts(6, 4, ABORTED_TS)  # rows 6-9 abort
    mem.dts[2] = 8  # a delete at 8 (the pipeline writes through the view)
    assert mem.visible_mask(4, n).tolist() == [False] * 10
    assert mem.visible_mask(7, n).tolist() == [True] * 6 + [False] * 4
    assert mem.visible_mask(8, n).tolist() == [True, True, False, True, True, True] + [False] * 4
    assert mem.dts.tolist()[2] == 8 and mem.cts.tolist()[9] == ABORTED_TS
    # the aborted rows keep their slots; the next append lands after them
    ((_, start, _, _),) = td.append(rows(10, 11), 1, MAX_TS)
    assert start == 10 and read(mem)[NAME][10] == "n10-é"
    mem.pad(3, ABORTED_TS)  # replay's placeholders: all null
    assert len(mem) == 14 and read(mem)[ID][11:] == [None] * 3


def test_a_block_fills_at_block_rows_and_the_next_one_opens():
    td = table_data()
    n = BLOCK_ROWS + 100
    ranges = td.append({ID: list(range(n)), NAME: [str(k) for k in range(n)]}, n, MAX_TS)
    assert [(r[1], r[2], r[3]) for r in ranges] == [(0, 0, BLOCK_ROWS), (0, BLOCK_ROWS, 100)]
    assert [len(b.mem) for b in td.blocks] == [BLOCK_ROWS, 100]
    assert read(td.blocks[1].mem)[NAME] == [str(k) for k in range(BLOCK_ROWS, n)]
    with pytest.raises(ValueError, match="beyond"):
        td.blocks[0].mem.write({ID: [1]}, 0, 1, MAX_TS)


def test_a_block_holding_a_running_transactions_rows_is_not_flushed():
    """Its object cannot hold rows whose commit ts is not known yet: flush refuses, and
    the block keeps its rows (tests/checkpoint/test_concurrent.py has the checkpoint
    that must not try)."""
    td = table_data()
    ((blk, _, _, _),) = td.append(rows(0, 4), 4, MAX_TS)
    blk.mem.set_cts(0, 3, 5)  # row 3 still belongs to a running transaction
    with pytest.raises(ValueError, match=r"running transaction's rows \(row 3\)"):
        blk.mem.flush(None, "data/10/100-1.parquet", "", ID)
    assert not blk.mem.flushed and read(blk.mem)[ID] == [0, 1, 2, 3]


def test_rows_in_memory_are_not_python_objects():
    """The block's values live in arrays: appending 8,000 rows leaves no int, float or
    str per value in Python's allocator (24,000 blocks if it did)."""
    td = table_data()
    keys = list(range(10**9, 10**9 + 8000))
    names = [f"value-{k}" for k in keys]
    gc.collect()
    before = sys.getallocatedblocks()
    td.append({ID: keys, NAME: names, SCORE: [k * 0.5 for k in keys]}, 8000, MAX_TS)
    del keys, names
    gc.collect()
    assert sys.getallocatedblocks() - before < 1000
    mem = td.blocks[0].mem
    held = [mem.cols[ID].data, mem.cols[SCORE].data, mem.cols[NAME].buf, mem.cts, mem.dts]
    assert all(isinstance(a, np.ndarray) for a in held)
    assert read(mem)[ID][:2] == [10**9, 10**9 + 1]


def test_columns_take_arrow_arrays_as_they_take_lists():
    """A columnar batch (tn.txn.rows.COLUMNAR_MIN rows or more) hands the memtable Arrow
    arrays: every type, nulls, NaN and a slice of an array read back as from lists."""
    td = table_data()
    types = td.column_types()
    src = rows(0, 300)
    src[SCORE][5] = float("nan")
    arrays = {cid: pa.array(vals, types[cid]) for cid, vals in src.items()}
    td.append(arrays, 300, MAX_TS)
    (blk,) = td.blocks
    blk.mem.write({cid: a.slice(100) for cid, a in arrays.items()}, 50, 100, MAX_TS, types)
    got = read(blk.mem)
    assert np.isnan(got[SCORE][5]) and got[SCORE][301] is None  # a NaN is no null
    want = {cid: vals + vals[150:250] for cid, vals in expected(0, 300).items()}
    got[SCORE][5] = want[SCORE][5] = None
    assert got == want
