"""The collector's records of a committed entry (no Kafka: it only reads the entry and
the engine's catalog)."""

from __future__ import annotations

import dataclasses

import pytest

from schemas.arrow_ipc import ipc_to_table
from schemas.logtail import COMMIT_TS, ROW_ID, Changes, make_row_id
from schemas.wal import Append, WalEntry
from tn.engine import Engine
from tn.logstore.driver import LogStore
from tn.logstore.memory_backend import MemoryDriver
from tn.logtail.collector import collect
from tn.logtail.engine_view import EngineCatalogView


def _engine_with_entries() -> tuple[Engine, list[WalEntry]]:
    engine = Engine(LogStore(MemoryDriver()))
    entries: list[WalEntry] = []
    engine.add_commit_listener(entries.append)
    t = engine.begin()
    t.create_database("db")
    t.create_table("db", "t", [("id", "int64"), ("v", "string")], "id")
    t.commit().result(10)
    t = engine.begin()
    t.insert("db", "t", [{"id": 1, "v": "a"}, {"id": 2, "v": None}])
    t.insert("db", "t", [{"id": 3, "v": "c"}])
    t.commit().result(10)
    return engine, entries


def test_inserts_carry_row_ids_and_the_commit_ts_beside_the_rows() -> None:
    engine, entries = _engine_with_entries()
    try:
        entry = entries[-1]
        _, tables = collect(entry, EngineCatalogView(engine))
        assert len(tables) == 1 and isinstance(tables[0].body, Changes)
        assert tables[0].body.inserts is not None
        rows = ipc_to_table(tables[0].body.inserts)
        assert rows.column_names == [ROW_ID, COMMIT_TS, "id", "v"]
        assert rows.column(COMMIT_TS).to_pylist() == [entry.txn.commit_ts] * 3
        assert [r["id"] for r in rows.to_pylist()] == [1, 2, 3]
        appended = [i for c in entry.commands if isinstance(c, Append) for i in c.infos]
        want = [make_row_id(i.dest.block_id, i.dest_offset + k) for i in appended for k in range(i.dest_length)]
        assert rows.column(ROW_ID).to_pylist() == want
    finally:
        engine.close()


def test_an_append_whose_lengths_disagree_is_refused_naming_the_entry() -> None:
    engine, entries = _engine_with_entries()
    try:
        entry = entries[-1]
        append = next(c for c in entry.commands if isinstance(c, Append))
        bad_info = dataclasses.replace(append.infos[0], dest_length=append.infos[0].dest_length + 1)
        bad = dataclasses.replace(append, infos=(bad_info, *append.infos[1:]))
        garbled = WalEntry(entry.lsn, entry.txn, tuple(bad if c is append else c for c in entry.commands))
        with pytest.raises(ValueError, match=rf"WAL entry {entry.lsn}: an Append moves"):
            collect(garbled, EngineCatalogView(engine))
    finally:
        engine.close()
