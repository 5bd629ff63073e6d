"""`kwal wal dump` over a log driver (the memory backend stands in for the file backend)."""

from __future__ import annotations

import io
import json
import sys
import types
from argparse import Namespace
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pyarrow as pa
import pytest

from schemas.arrow_ipc import table_to_ipc
from schemas.codec import encode_entry
from schemas.wal import (
    Append,
    AppendInfo,
    CatalogKind,
    CatalogReason,
    ColumnDef,
    ColumnType,
    Delete,
    Dest,
    EntryNode,
    TableSchema,
    TxnContext,
    UpdateCatalog,
    WalEntry,
)
from tn.logstore import dump
from tn.logstore.driver import LogRecord, LogStore
from tn.logstore.memory_backend import MemoryDriver

ORDERS = TableSchema(
    (ColumnDef(1, "id", ColumnType.INT64, False), ColumnDef(2, "name", ColumnType.STRING)), "id"
)
BLOCK = Dest(1, 3, 1, 7)


def _ddl(lsn: int) -> WalEntry:
    return WalEntry(
        lsn,
        TxnContext(1000, 1001),
        (UpdateCatalog(CatalogKind.TABLE, Dest(1, 3), EntryNode(1001, name="orders", schema=ORDERS)),),
    )


def _insert(lsn: int) -> WalEntry:
    table = pa.table({"id": pa.array(range(100), pa.int64()), "name": ["x"] * 100})
    return WalEntry(
        lsn,
        TxnContext(1002, 1003, (BLOCK,)),
        (
            UpdateCatalog(CatalogKind.BLOCK, BLOCK, EntryNode(1003), CatalogReason.ALLOCATE),
            Append((AppendInfo(0, 100, BLOCK, 0, 100),), table_to_ipc(table)),
            Delete(BLOCK, (3, 4)),
        ),
    )


def _encode_at(make: Callable[[int], WalEntry], lsn: int) -> bytes:
    return encode_entry(make(0), lsn)


def _store(*payloads: bytes | None) -> LogStore:
    """A memory log of the example entries; a bytes payload replaces that entry."""
    store = LogStore(MemoryDriver())
    makers = [_ddl, _insert]
    for i, payload in enumerate(payloads):
        if payload is not None:
            store.append(payload)
            continue
        store.append(partial(_encode_at, makers[i % 2]))
    return store


def test_human_summary() -> None:
    out = io.StringIO()
    assert dump.dump_records(_store(None, None).records(), as_json=False, out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines == [
        "lsn=1 start=1000 commit=1001 memo=0: catalog table#3 create 'orders' (2 cols, pk=id, v1)",
        "lsn=2 start=1002 commit=1003 memo=1: catalog block#7 create [allocate]; "
        "append t=3 blk=7 rows 0..99 (100); delete t=3 blk=7 rows=[3,4]",
        "-- 2 entries (lsn 1..2), 0 errors",
    ]


def test_summaries_of_other_commands() -> None:
    flush = UpdateCatalog(CatalogKind.BLOCK, BLOCK, EntryNode(5, meta_loc="s3://b/o1"), CatalogReason.FLUSH)
    assert dump.summarize_command(flush) == "catalog block#7 update meta=s3://b/o1 [flush]"
    drop = UpdateCatalog(CatalogKind.DATABASE, Dest(4), EntryNode(5, 9, name="db"))
    assert dump.summarize_command(drop) == "catalog database#4 drop 'db'"
    many = Delete(BLOCK, tuple(range(100)))
    assert dump.summarize_command(many) == "delete t=3 blk=7 rows=[0,1,2,3,4,5,6,7,...,99] (100)"
    two = Append((AppendInfo(0, 5, BLOCK, 8187, 5), AppendInfo(5, 3, Dest(1, 3, 1, 8), 0, 3)), b"")
    assert dump.summarize_command(two) == "append t=3 blk=7 rows 8187..8191 (5), t=3 blk=8 rows 0..2 (3)"
    empty = WalEntry(9, TxnContext(1, 2))
    assert dump.summarize_entry(empty) == "lsn=9 start=1 commit=2 memo=0: (no commands)"


def test_json_lines() -> None:
    out = io.StringIO()
    assert dump.dump_records(_store(None, None).records(), as_json=True, out=out) == 0
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["lsn"] == 1 and first["start_ts"] == 1000 and first["commit_ts"] == 1001
    (ddl,) = first["commands"]
    assert ddl["type"] == "update_catalog" and ddl["kind"] == "table" and ddl["reason"] == "ddl"
    assert ddl["node"]["name"] == "orders"
    assert [c["name"] for c in ddl["node"]["schema"]["columns"]] == ["id", "name"]
    assert second["memo"] == [{"db_id": 1, "table_id": 3, "segment_id": 1, "block_id": 7}]
    assert [c["type"] for c in second["commands"]] == ["update_catalog", "append", "delete"]
    append = second["commands"][1]
    assert append["infos"][0]["dest_length"] == 100 and append["batch_bytes"] > 0 and append["batch_rows"] == 100
    assert "batch" not in append
    assert second["commands"][2]["rows"] == [3, 4]


@pytest.mark.parametrize("as_json", [False, True])
def test_bad_records_are_reported_and_the_dump_goes_on(as_json: bool) -> None:
    good = encode_entry(_ddl(2))
    store = _store(None, good[:-3], None, b"garbage")
    out = io.StringIO()
    assert dump.dump_records(store.records(), as_json=as_json, out=out) == 2
    lines = out.getvalue().splitlines()
    if as_json:
        rows = [json.loads(line) for line in lines]
        assert [r["lsn"] for r in rows] == [1, 2, 3, 4]
        assert "error" in rows[1] and "'wal_entry'" in rows[1]["error"]
        assert "not a kwal record" in rows[3]["error"]
        assert "error" not in rows[2]
    else:
        assert lines[1].startswith("lsn=2 ERROR: cannot decode 'wal_entry' record")
        assert lines[2].startswith("lsn=3 start=1000")
        assert lines[3].startswith("lsn=4 ERROR: not a kwal record")
        assert lines[-1] == "-- 4 entries (lsn 1..4), 2 errors"


def test_entry_stored_at_the_wrong_lsn_is_an_error() -> None:
    records = [LogRecord(5, encode_entry(_ddl(6)))]
    out = io.StringIO()
    assert dump.dump_records(records, as_json=False, out=out) == 1
    assert out.getvalue().startswith("lsn=5 ERROR: entry carries lsn 6 but is stored at lsn 5")


def test_bad_append_batches_are_errors() -> None:
    allocate, append, _ = _insert(1).commands
    assert isinstance(append, Append)
    garbled = Append(append.infos, b"not arrow")
    short = Append((AppendInfo(0, 101, BLOCK, 0, 101),), append.batch)
    txn = TxnContext(1, 2)
    records = [
        LogRecord(1, encode_entry(WalEntry(1, txn, (garbled,)))),
        LogRecord(2, encode_entry(WalEntry(2, txn, (allocate, short)))),
    ]
    out = io.StringIO()
    assert dump.dump_records(records, as_json=False, out=out) == 2
    first, second, _ = out.getvalue().splitlines()
    assert first.startswith("lsn=1 ERROR: command 0 (append): truncated Arrow IPC stream")
    assert second == "lsn=2 ERROR: command 1 (append): rows 0..+101 point past the batch's 100 rows"


def test_empty_log() -> None:
    out = io.StringIO()
    assert dump.dump_records([], as_json=False, out=out) == 0
    assert out.getvalue() == "-- 0 entries, 0 errors\n"


# --- run(): the command ------------------------------------------------------------------


@pytest.fixture
def fake_file_backend(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """Stands in for tn.logstore.file_backend: FileDriver(path, recovery_mode=...)
    opens a memory log holding one good and one bad entry."""
    opened: dict[str, object] = {}

    def file_driver(path: str, recovery_mode: str = "point-in-time", *, read_only: bool = False) -> MemoryDriver:
        opened.update(path=path, recovery_mode=recovery_mode, read_only=read_only)
        driver = MemoryDriver()
        driver.append(1, encode_entry(_ddl(1)))
        driver.append(2, b"KW\x01")
        opened["driver"] = driver
        return driver

    module = types.ModuleType("tn.logstore.file_backend")
    module.FileDriver = file_driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tn.logstore.file_backend", module)
    return opened


def test_run_opens_the_file_backend(
    tmp_path: Path, fake_file_backend: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    args = Namespace(path=str(tmp_path), json=False, recovery_mode="absolute")
    assert dump.run(args, cfg=None) == 1
    assert fake_file_backend["path"] == str(tmp_path)
    assert fake_file_backend["recovery_mode"] == "absolute"
    assert fake_file_backend["read_only"] is True
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("lsn=1 start=1000")
    assert lines[1].startswith("lsn=2 ERROR: ")
    assert lines[2] == "-- 2 entries (lsn 1..2), 1 error"
    driver = fake_file_backend["driver"]
    assert isinstance(driver, MemoryDriver)
    assert driver.append(3, b"").exception() is not None  # closed


def test_run_refuses_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = Namespace(path=str(tmp_path / "nope"), json=True, recovery_mode="point-in-time")
    assert dump.run(args, cfg=None) == 2
    assert "no WAL directory" in capsys.readouterr().err


def test_the_cli_reaches_run(
    tmp_path: Path,
    fake_file_backend: dict[str, object],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ops.cli import main

    monkeypatch.delenv("KWAL_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["wal", "dump", str(tmp_path), "--json"]) == 1
    assert fake_file_backend["recovery_mode"] == "point-in-time"
    first, second = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert first["lsn"] == 1 and second == {"lsn": 2, "error": second["error"]}


def test_dump_of_a_real_file_wal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """End to end on the file backend, once it provides FileDriver."""
    backend = pytest.importorskip("tn.logstore.file_backend")
    file_driver = getattr(backend, "FileDriver", None)
    if file_driver is None:
        pytest.skip("tn.logstore.file_backend has no FileDriver yet")
    wal = tmp_path / "wal"
    wal.mkdir()
    store = LogStore(file_driver(str(wal), recovery_mode="point-in-time"))
    makers = [_ddl, _insert, _ddl]
    futures = [store.append(partial(_encode_at, make)) for make in makers]
    assert [f.result(timeout=30) for f in futures] == [1, 2, 3]
    store.close()
    assert dump.run(Namespace(path=str(wal), json=False, recovery_mode="point-in-time"), None) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["lsn=1", "lsn=2", "lsn=3"]
    assert "append t=3 blk=7 rows 0..99 (100)" in lines[1]
    assert lines[3] == "-- 3 entries (lsn 1..3), 0 errors"

    # A torn tail is reported, and left on disk: the dump opens the log read-only.
    (segment,) = [p for p in wal.iterdir() if p.is_file() and p.stat().st_size > 0]
    with segment.open("ab") as f:
        f.write(b"\x01\x02\x03")
    before = {p.name: p.read_bytes() for p in wal.iterdir() if p.is_file()}
    assert dump.run(Namespace(path=str(wal), json=True, recovery_mode="point-in-time"), None) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 3
    assert "recovery ends the log at damage" in captured.err
    assert {p.name: p.read_bytes() for p in wal.iterdir() if p.is_file()} == before

    assert dump.run(Namespace(path=str(wal), json=False, recovery_mode="bogus"), None) == 2
    assert "unknown recovery mode 'bogus'" in capsys.readouterr().err
