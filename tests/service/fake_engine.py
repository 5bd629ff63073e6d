"""A small stand-in for `tn.engine.Engine` with the same contract (snapshot
isolation on primary keys, commit futures, snapshot reads). Lets the service's
Kafka plumbing be tested on its own; the integration tests use the real one."""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from schemas.wal import ColumnDef, ColumnType, TableSchema
from tn.exceptions import ConflictError, TnError, ValidationError


class FakeEngine:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clock = itertools.count(1)
        self._now = 0
        self._pool = ThreadPoolExecutor(1)
        self.log_failure: BaseException | None = None  # it has no log to fail
        # (db, table) -> (schema, created_ts, dropped_ts)
        self._tables: dict[tuple[str, str], tuple[TableSchema, int, int]] = {}
        self._dbs: dict[str, int] = {}
        # (db, table) -> key -> list[(ts, row|None)]
        self._versions: dict[
            tuple[str, str], dict[Any, list[tuple[int, dict[str, Any] | None]]]
        ] = {}

    def _tick(self) -> int:
        self._now = next(self._clock)
        return self._now

    def now(self) -> int:
        return self._now

    def begin(self) -> FakeTxn:
        with self._lock:
            return FakeTxn(self, self._now)

    def tables(self, ts: int | None = None) -> dict[str, list[str]]:
        ts = self._now if ts is None else ts
        out: dict[str, list[str]] = {db: [] for db, c in self._dbs.items() if c <= ts}
        for (db, t), (_, c, d) in self._tables.items():
            if c <= ts and (d == 0 or d > ts):
                out.setdefault(db, []).append(t)
        return out

    def schema(self, database: str, table: str, ts: int | None = None) -> TableSchema:
        ts = self._now if ts is None else ts
        entry = self._tables.get((database, table))
        if entry is None or entry[1] > ts or (entry[2] and entry[2] <= ts):
            raise ValidationError("unknown_table", f"no table {database}.{table}")
        return entry[0]

    def read(self, database: str, table: str, ts: int | None = None) -> pa.Table:
        ts = self._now if ts is None else ts
        schema = self.schema(database, table, ts)
        rows = []
        with self._lock:
            for versions in self._versions[(database, table)].values():
                live = [r for t, r in versions if t <= ts]
                if live and live[-1] is not None:
                    rows.append(live[-1])
        return pa.Table.from_pylist(
            rows, schema=pa.schema([(c.name, _arrow(c.type)) for c in schema.columns])
        )

    def close(self) -> None:
        self._pool.shutdown()


def _arrow(t: ColumnType) -> pa.DataType:
    return {
        "int64": pa.int64(),
        "float64": pa.float64(),
        "string": pa.string(),
        "bool": pa.bool_(),
    }.get(t.value, pa.binary())


class FakeTxn:
    def __init__(self, engine: FakeEngine, start_ts: int) -> None:
        self.engine = engine
        self.start_ts = start_ts
        self._ddl: list[tuple[str, Any]] = []
        self._writes: list[tuple[str, str, Any, dict[str, Any] | None]] = []
        self._new_tables: dict[tuple[str, str], TableSchema] = {}

    def create_database(self, name: str) -> None:
        if name in self.engine._dbs:
            raise ValidationError("exists", name)
        self._ddl.append(("db", name))

    def drop_database(self, name: str) -> None:
        raise TnError("unsupported", "fake engine")

    def create_table(
        self, database: str, name: str, columns: list[tuple[str, str]], primary_key: str
    ) -> None:
        try:
            schema = TableSchema(
                tuple(ColumnDef(i, n, ColumnType(t)) for i, (n, t) in enumerate(columns)),
                primary_key,
            )
        except ValueError as e:
            raise ValidationError("type_mismatch", str(e)) from e
        self._new_tables[(database, name)] = schema
        self._ddl.append(("table", (database, name, schema)))

    def drop_table(self, database: str, name: str) -> None:
        self._schema(database, name)
        self._ddl.append(("drop", (database, name)))

    def add_column(self, *a: Any) -> None:
        raise TnError("unsupported", "fake engine")

    drop_column = add_column

    def _schema(self, database: str, table: str) -> TableSchema:
        if (database, table) in self._new_tables:
            return self._new_tables[(database, table)]
        return self.engine.schema(database, table, self.start_ts)

    def insert(self, database: str, table: str, rows: pa.Table | list[dict[str, Any]]) -> None:
        self._write(database, table, rows, insert=True)

    def update(self, database: str, table: str, rows: pa.Table | list[dict[str, Any]]) -> None:
        self._write(database, table, rows, insert=False)

    def _write(self, database: str, table: str, rows: Any, insert: bool) -> None:
        schema = self._schema(database, table)
        rows_list = rows.to_pylist() if isinstance(rows, pa.Table) else list(rows)
        names = {c.name for c in schema.columns}
        for r in rows_list:
            if set(r) - names:
                raise ValidationError("bad_column", str(set(r) - names))
            if r.get(schema.primary_key) is None:
                raise ValidationError("missing_primary_key", schema.primary_key)
            key = r[schema.primary_key]
            if insert:
                versions = self.engine._versions.get((database, table), {}).get(key, [])
                live = [row for t, row in versions if t <= self.start_ts]
                if live and live[-1] is not None:
                    raise ValidationError("duplicate_key", repr(key))
            self._writes.append((database, table, key, r))

    def delete(self, database: str, table: str, keys: list[Any]) -> None:
        self._schema(database, table)
        for k in keys:
            self._writes.append((database, table, k, None))

    def rollback(self) -> None:
        self._writes.clear()

    def commit(self) -> Future[int]:
        return self.engine._pool.submit(self._commit)

    def _commit(self) -> int:
        e = self.engine
        time.sleep(0.002)  # a WAL write takes a moment: lets transactions overlap
        with e._lock:
            for db, t, k, _ in self._writes:
                versions = e._versions.get((db, t), {}).get(k, [])
                if versions and versions[-1][0] > self.start_ts:
                    raise ConflictError("write_conflict", f"{db}.{t} key {k!r}")
            ts = e._tick()
            for kind, arg in self._ddl:
                if kind == "db":
                    e._dbs[arg] = ts
                elif kind == "table":
                    db, name, schema = arg
                    e._tables[(db, name)] = (schema, ts, 0)
                    e._versions[(db, name)] = {}
                elif kind == "drop":
                    s, c, _ = e._tables[arg]
                    e._tables[arg] = (s, c, ts)
            for db, t, k, r in self._writes:
                e._versions[(db, t)].setdefault(k, []).append((ts, r))
            return ts
