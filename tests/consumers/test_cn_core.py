"""The CN core on synthetic logtail records: idempotent apply, watermarks, snapshots."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from consumers.core.cn import CNCore
from consumers.core.exceptions import AboveWatermarkError, NotSubscribedError, TableNotFoundError
from infra.objectstore import FolderStore
from schemas.arrow_ipc import table_to_ipc
from schemas.logtail import (
    COMMIT_TS,
    ROW_ID,
    BlockMeta,
    Catalog,
    CatalogOp,
    Changes,
    Heartbeat,
    LogtailRecord,
    decode_logtail,
    encode_logtail,
    make_row_id,
)
from schemas.wal import ColumnDef, ColumnType, TableSchema

SCHEMA = TableSchema(
    (ColumnDef(1, "id", ColumnType.INT64, False), ColumnDef(2, "v", ColumnType.STRING)), "id"
)
T = "db.t"


def create(ts: int, schema: TableSchema = SCHEMA) -> LogtailRecord:
    return LogtailRecord("db", "t", ts, Catalog(CatalogOp.CREATE_TABLE, 1, schema), table_id=7)


def inserts(ts: int, lsn: int, rows: list[tuple[int, int, str]]) -> LogtailRecord:
    """rows: (row offset in block 1, id, v)"""
    batch = pa.table(
        {
            ROW_ID: pa.array([make_row_id(1, o) for o, _, _ in rows], pa.int64()),
            COMMIT_TS: pa.array([ts] * len(rows), pa.int64()),
            "id": pa.array([i for _, i, _ in rows], pa.int64()),
            "v": pa.array([v for _, _, v in rows], pa.string()),
        }
    )
    return LogtailRecord("db", "t", ts, Changes(inserts=table_to_ipc(batch)), 7, lsn)


def deletes(ts: int, lsn: int, offsets: list[int], ids: list[int]) -> LogtailRecord:
    batch = pa.table(
        {
            ROW_ID: pa.array([make_row_id(1, o) for o in offsets], pa.int64()),
            COMMIT_TS: pa.array([ts] * len(offsets), pa.int64()),
            "id": pa.array(ids, pa.int64()),
        }
    )
    return LogtailRecord("db", "t", ts, Changes(deletes=table_to_ipc(batch)), 7, lsn)


def update(ts: int, lsn: int, old_offset: int, new: tuple[int, int, str]) -> LogtailRecord:
    ins = inserts(ts, lsn, [new]).body
    dels = deletes(ts, lsn, [old_offset], [new[1]]).body
    assert isinstance(ins, Changes) and isinstance(dels, Changes)
    return LogtailRecord("db", "t", ts, Changes(ins.inserts, dels.deletes), 7, lsn)


def catalog_heartbeat(ts: int) -> LogtailRecord:
    return LogtailRecord("", "", ts, Heartbeat())


def rows(cn: CNCore, ts: int | None = None) -> list[tuple[int, str]]:
    snap = cn.snapshot(T, ts)
    return list(zip(snap.column("id").to_pylist(), snap.column("v").to_pylist(), strict=True))


def test_records_round_trip_through_the_codec() -> None:
    for rec in (create(5), inserts(10, 1, [(0, 1, "a")]), deletes(11, 2, [0], [1]), catalog_heartbeat(12)):
        assert decode_logtail(encode_logtail(rec)) == rec


def test_inserts_deletes_updates_and_time_travel() -> None:
    cn = CNCore([T])
    cn.apply_many(
        [
            create(5),
            inserts(10, 1, [(0, 1, "a"), (1, 2, "b")]),
            deletes(20, 2, [0], [1]),
            # update of id 2 = delete old row + insert new row, in one record per transaction
            update(30, 3, 1, (2, 2, "b2")),
            catalog_heartbeat(30),
        ]
    )
    assert cn.watermark(T) == 30
    assert rows(cn, 9) == []
    assert rows(cn, 10) == [(1, "a"), (2, "b")]
    assert rows(cn, 25) == [(2, "b")]
    assert rows(cn, 30) == [(2, "b2")]


def test_redelivery_changes_nothing() -> None:
    cn = CNCore([T])
    recs = [create(5), inserts(10, 1, [(0, 1, "a")]), inserts(12, 2, [(1, 2, "b")]), catalog_heartbeat(12)]
    cn.apply_many(recs)
    before = rows(cn)
    cn.apply_many(recs)  # everything again, as after a restart from an older offset
    assert rows(cn) == before == [(1, "a"), (2, "b")]


def test_never_answers_above_watermark() -> None:
    cn = CNCore([T])
    cn.apply_many([create(5), inserts(10, 1, [(0, 1, "a")]), catalog_heartbeat(10)])
    with pytest.raises(AboveWatermarkError, match="up to 10"):
        cn.snapshot(T, 11)
    with pytest.raises(NotSubscribedError):
        cn.snapshot("db.other", 5)


def test_a_transactions_records_applied_poll_by_poll_never_move_the_watermark_back() -> None:
    """One transaction at ts 5 creates the database and the table and inserts a row; its
    records reach the CN in separate polls, then the TN's catalog mark after the group.
    Every reported watermark is at least the one before it, and none claims ts 5 before
    the whole transaction is applied."""
    cn = CNCore([T])
    marks: list[int] = []
    cn.on_watermark = marks.append
    cn.apply_many([catalog_heartbeat(3)])
    cn.apply(LogtailRecord("db", "", 5, Catalog(CatalogOp.CREATE_DATABASE, 1)))
    cn.apply(create(5))
    assert cn.watermark() < 5 and cn.watermark(T) < 5
    cn.apply(inserts(5, 1, [(0, 1, "a")]))
    assert cn.watermark() < 5
    cn.apply(catalog_heartbeat(5))
    assert marks == sorted(marks) and marks[0] == 3 and marks[-1] == 5
    assert rows(cn, 5) == [(1, "a")]


def test_idle_table_advances_by_heartbeats_alone() -> None:
    cn = CNCore([T])
    cn.apply_many([create(5), inserts(10, 1, [(0, 1, "a")]), catalog_heartbeat(10)])
    assert cn.watermark() == 10
    cn.apply(LogtailRecord("db", "t", 50, Heartbeat()))
    cn.apply(catalog_heartbeat(50))
    assert cn.watermark() == 50
    assert rows(cn, 50) == [(1, "a")]
    # a heartbeat from the past never moves it back (a reconnect re-reading old records)
    cn.apply(LogtailRecord("db", "t", 20, Heartbeat()))
    assert cn.watermark() == 50


def test_drop_table_hides_rows_after_not_before() -> None:
    cn = CNCore([T])
    cn.apply_many(
        [
            create(5),
            inserts(10, 1, [(0, 1, "a")]),
            LogtailRecord("db", "t", 20, Catalog(CatalogOp.DROP_TABLE, 1), 7),
            LogtailRecord("db", "t", 20, Heartbeat()),
            catalog_heartbeat(20),  # the TN's mark after the group
        ]
    )
    assert rows(cn, 15) == [(1, "a")]
    with pytest.raises(TableNotFoundError):
        cn.snapshot(T, 20)


def test_alter_table_add_column_projects_nulls() -> None:
    cn = CNCore([T])
    wider = TableSchema((*SCHEMA.columns, ColumnDef(3, "n", ColumnType.INT64)), "id", 2)
    cn.apply_many(
        [
            create(5),
            inserts(10, 1, [(0, 1, "a")]),
            LogtailRecord("db", "t", 15, Catalog(CatalogOp.ALTER_TABLE, 1, wider), 7),
            catalog_heartbeat(15),
            LogtailRecord("db", "t", 15, Heartbeat()),
        ]
    )
    assert cn.snapshot(T, 12).column_names == ["id", "v"]
    snap = cn.snapshot(T, 15)
    assert snap.column_names == ["id", "v", "n"]
    assert snap.column("n").to_pylist() == [None]


def test_block_meta_moves_rows_to_object_storage_keeping_later_deletes(tmp_path: Path) -> None:
    """A delete committed while its block is being dumped is not lost (seed 001, 清理内存)."""
    store = FolderStore(tmp_path)
    cn = CNCore([T], store.get)
    cn.apply_many([create(5), inserts(10, 1, [(0, 1, "a"), (1, 2, "b")]), deletes(20, 2, [0], [1])])
    # The flush started at ts 25 and dumped rows and deletes committed before it ...
    block_rows = pa.table(
        {
            ROW_ID: pa.array([make_row_id(1, 0), make_row_id(1, 1)], pa.int64()),
            COMMIT_TS: pa.array([10, 10], pa.int64()),
            "id": pa.array([1, 2], pa.int64()),
            "v": pa.array(["a", "b"]),
        }
    )
    block_dels = pa.table({ROW_ID: pa.array([make_row_id(1, 0)], pa.int64()), COMMIT_TS: pa.array([20], pa.int64())})
    for key, table in (("blk-1.parquet", block_rows), ("blk-1-del.parquet", block_dels)):
        buf = io.BytesIO()
        pq.write_table(table, buf)
        store.put(key, buf.getvalue())
    # ... while a delete of row 1 committed at 27, during the flush, arrives before the block meta.
    cn.apply(deletes(27, 3, [1], [2]))
    cn.apply(LogtailRecord("db", "t", 30, BlockMeta(1, "blk-1.parquet", 25, "blk-1-del.parquet"), 7))
    cn.apply(catalog_heartbeat(30))
    state = cn.tables[T][0]
    assert state.inserts == []  # every in-memory row of block 1 was older than 25
    assert 1 in state.blocks_with_memory_deletes  # the delete at 27 is kept in memory
    assert rows(cn, 15) == [(1, "a"), (2, "b")]
    assert rows(cn, 22) == [(2, "b")]
    assert rows(cn, 30) == []
