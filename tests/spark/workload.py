"""A deterministic random logtail workload, written straight to the catalog and table topics
with `encode_logtail`, and its oracle: `CNCore` fed the same records in the same order."""

from __future__ import annotations

import io
import random
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from confluent_kafka import Producer

from consumers.core.cn import CNCore
from infra.config import KwalConfig
from schemas.arrow_ipc import arrow_schema, table_to_ipc
from schemas.logtail import (
    COMMIT_TS,
    ROW_ID,
    BlockMeta,
    Catalog,
    CatalogOp,
    Changes,
    Heartbeat,
    LogtailRecord,
    encode_logtail,
    make_row_id,
)
from schemas.wal import ColumnDef, ColumnType, TableSchema

SCHEMA = TableSchema(
    (
        ColumnDef(1, "id", ColumnType.INT64, False),
        ColumnDef(2, "name", ColumnType.STRING),
        ColumnDef(3, "score", ColumnType.FLOAT64),
        ColumnDef(4, "at", ColumnType.TIMESTAMP),
    ),
    "id",
)

_EMPTY = pa.schema(
    [pa.field(ROW_ID, pa.int64()), pa.field(COMMIT_TS, pa.int64()), *arrow_schema(SCHEMA)]
).empty_table()


def _added_values(column: ColumnDef, pks: list[int]) -> pa.Array:
    """Values of a column added by `Workload.alter_add` (string or int64), derived from the
    primary key so a lost or misplaced value shows."""
    if column.type is ColumnType.STRING:
        return pa.array([f"{column.name}-{pk}" for pk in pks], pa.string())
    return pa.array([pk * 10 + column.column_id for pk in pks], pa.int64())


@dataclass
class _Table:
    name: str  # db.table
    block: int
    next_offset: int = 0
    live: dict[int, int] = field(default_factory=dict)  # pk -> row id
    next_pk: int = 0
    schema: TableSchema = SCHEMA


@dataclass
class Workload:
    """Records in generation (= commit ts) order, each with its topic."""

    cfg: KwalConfig
    records: list[tuple[str, LogtailRecord]] = field(default_factory=list)
    ts: int = 1000
    lsn: int = 0
    tables: dict[str, _Table] = field(default_factory=dict)
    change_rows: int = 0
    rng: random.Random = field(default_factory=lambda: random.Random(8))
    objects: dict[str, bytes] = field(default_factory=dict)  # the oracle's object store
    inserted: dict[str, list[pa.Table]] = field(default_factory=dict)
    _block: int = 1

    def _topic(self, table: str) -> str:
        db, _, name = table.partition(".")
        return self.cfg.topics.logtail(db, name)

    def _next(self) -> tuple[int, int]:
        self.ts += self.rng.randint(1, 5)
        self.lsn += 1
        return self.ts, self.lsn

    def _add(self, topic: str, record: LogtailRecord) -> None:
        self.records.append((topic, record))

    def create(self, table: str) -> None:
        ts, lsn = self._next()
        db, _, name = table.partition(".")
        self.tables[table] = _Table(table, self._block)
        self._block += 1
        self._add(self.cfg.topics.catalog, LogtailRecord(db, name, ts, Catalog(CatalogOp.CREATE_TABLE, 1, SCHEMA), 7, lsn))

    def alter_add(self, table: str, column: str, column_type: ColumnType) -> None:
        """ALTER TABLE ADD COLUMN: a catalog record with the new schema; later rows carry
        the column."""
        ts, lsn = self._next()
        t = self.tables[table]
        cols = t.schema.columns
        new = ColumnDef(max(c.column_id for c in cols) + 1, column, column_type)
        t.schema = TableSchema((*cols, new), t.schema.primary_key)
        db, _, name = table.partition(".")
        body = Catalog(CatalogOp.ALTER_TABLE, 1, t.schema)
        self._add(self.cfg.topics.catalog, LogtailRecord(db, name, ts, body, 7, lsn))

    def drop(self, table: str) -> None:
        ts, lsn = self._next()
        db, _, name = table.partition(".")
        self._add(self.cfg.topics.catalog, LogtailRecord(db, name, ts, Catalog(CatalogOp.DROP_TABLE, 1, None), 7, lsn))
        del self.tables[table]

    def heartbeat(self) -> int:
        """A heartbeat on the catalog topic and every live table's topic."""
        ts, _ = self._next()
        self._add(self.cfg.topics.catalog, LogtailRecord("", "", ts, Heartbeat()))
        for t in self.tables:
            db, _, name = t.partition(".")
            self._add(self._topic(t), LogtailRecord(db, name, ts, Heartbeat()))
        return ts

    def block_meta(self, table: str) -> None:
        ts, _ = self._next()
        t = self.tables[table]
        db, _, name = table.partition(".")
        key = f"objects/{table}/{t.block}-{ts}.parquet"
        rows = pa.concat_tables(self.inserted.get(table, []) or [_EMPTY])
        rows = rows.filter(pc.equal(pc.shift_right(rows.column(ROW_ID), 16), t.block))
        sink = io.BytesIO()
        pq.write_table(rows, sink)
        self.objects[key] = sink.getvalue()
        meta = BlockMeta(t.block, key, ts, "", 0, 0)
        self._add(self._topic(table), LogtailRecord(db, name, ts, meta))

    def txn(self, table: str, inserts: int, deletes: int, updates: int) -> None:
        """One transaction: new rows, deleted rows, and updates (delete + insert, same pk)."""
        ts, lsn = self._next()
        t = self.tables[table]
        db, _, name = table.partition(".")
        victims = self.rng.sample(sorted(t.live), min(len(t.live), deletes + updates))
        dels = victims[:deletes]
        upds = victims[deletes:]
        del_rows = [(t.live.pop(pk), pk) for pk in dels + upds]
        new_pks = []
        for _ in range(inserts):
            new_pks.append(t.next_pk)
            t.next_pk += 1
        new_pks += upds
        ins_ids = []
        for pk in new_pks:
            if t.next_offset >= 8192:
                t.block = self._block
                self._block += 1
                t.next_offset = 0
            rid = make_row_id(t.block, t.next_offset)
            t.next_offset += 1
            t.live[pk] = rid
            ins_ids.append(rid)
        body_ins = body_del = None
        if new_pks:
            n = len(new_pks)
            cols = arrow_schema(t.schema)
            data = {
                ROW_ID: pa.array(ins_ids, pa.int64()),
                COMMIT_TS: pa.array([ts] * n, pa.int64()),
                "id": pa.array(new_pks, pa.int64()),
                "name": pa.array(
                    [None if self.rng.random() < 0.1 else f"n{pk}-{ts}" for pk in new_pks],
                    pa.string(),
                ),
                "score": pa.array([self.rng.random() * 100 for _ in new_pks], pa.float64()),
                "at": pa.array([ts * 1000] * n, pa.int64()).cast(cols.field("at").type),
            }
            for c in t.schema.columns[len(SCHEMA.columns):]:  # added by alter_add
                data[c.name] = _added_values(c, new_pks)
            ins_table = pa.table(data)
            self.inserted.setdefault(table, []).append(ins_table)
            body_ins = table_to_ipc(ins_table)
        if del_rows:
            body_del = table_to_ipc(
                pa.table(
                    {
                        ROW_ID: pa.array([r for r, _ in del_rows], pa.int64()),
                        COMMIT_TS: pa.array([ts] * len(del_rows), pa.int64()),
                        "id": pa.array([pk for _, pk in del_rows], pa.int64()),
                    }
                )
            )
        self.change_rows += len(new_pks) + len(del_rows)
        self._add(self._topic(table), LogtailRecord(db, name, ts, Changes(body_ins, body_del), 7, lsn))

    def random_txns(self, tables: list[str], n: int, max_rows: int = 6) -> None:
        for _ in range(n):
            table = self.rng.choice(tables)
            live = len(self.tables[table].live)
            self.txn(
                table,
                inserts=self.rng.randint(0 if live else 1, max_rows),
                deletes=self.rng.randint(0, 2) if live > 3 else 0,
                updates=self.rng.randint(0, 2) if live > 3 else 0,
            )
            if self.rng.random() < 0.15:
                self.heartbeat()

    def kafka_rows(self) -> list[tuple[str, int, bytes]]:
        """The records as they land on their topics' partition 0, in order: (topic, offset,
        encoded value)."""
        offsets: dict[str, int] = {}
        rows = []
        for topic, r in self.records:
            rows.append((topic, offsets.setdefault(topic, 0), encode_logtail(r)))
            offsets[topic] += 1
        return rows

    def oracle(self, subscribed: list[str], upto: int | None = None) -> CNCore:
        """CNCore fed the first `upto` records (default all)."""
        core = CNCore(subscribed, self.objects.__getitem__)
        core.apply_many(r for _, r in self.records[: upto if upto is not None else len(self.records)])
        return core


def produce(bootstrap: str, records: list[tuple[str, LogtailRecord]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for topic, record in records:
        p.produce(topic, value=encode_logtail(record), partition=0)
    assert p.flush(30) == 0, "records not acknowledged"
