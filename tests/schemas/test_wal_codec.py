"""The record envelope, the WAL entry codec and Arrow IPC batches."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import codec
from schemas.arrow_ipc import ipc_to_table, table_to_ipc
from schemas.codec import (
    FORMAT_VERSION,
    MAGIC,
    decode_entry,
    decode_record,
    encode_entry,
    encode_record,
    entry_to_record,
    known_schemas,
    schema_of,
)
from schemas.exceptions import (
    CodecError,
    DecodeError,
    EncodeError,
    UnexpectedSchemaError,
    UnsupportedFormatError,
)
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
from tests.schemas.strategies import (
    appends,
    arrow_tables,
    deletes,
    dests,
    table_schemas,
    update_catalogs,
    wal_entries,
)

# Arrow tables are costly to draw; keep runs short on a shared machine.
FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _one(cmd: object) -> WalEntry:
    return WalEntry(7, TxnContext(100, 101, (Dest(1, 2, 3, 4),)), (cmd,))  # type: ignore[arg-type]


def _example() -> WalEntry:
    batch = table_to_ipc(pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", None]}))
    orders = TableSchema(
        (ColumnDef(1, "id", ColumnType.INT64, False), ColumnDef(2, "name", ColumnType.STRING)), "id"
    )
    return WalEntry(
        lsn=42,
        txn=TxnContext(1000, 1001, (Dest(1, 3, 1, 7),)),
        commands=(
            UpdateCatalog(CatalogKind.TABLE, Dest(1, 3), EntryNode(1001, name="orders", schema=orders)),
            UpdateCatalog(CatalogKind.BLOCK, Dest(1, 3, 1, 7), EntryNode(1001), CatalogReason.ALLOCATE),
            Append((AppendInfo(0, 2, Dest(1, 3, 1, 7), 0, 2),), batch),
            Delete(Dest(1, 3, 1, 7), (0,)),
        ),
    )


# --- round trips ----------------------------------------------------------------------


@FEW
@given(update_catalogs)
def test_update_catalog_round_trip(cmd: UpdateCatalog) -> None:
    entry = _one(cmd)
    assert decode_entry(encode_entry(entry)) == entry


@FEW
@given(appends())
def test_append_round_trip(cmd: Append) -> None:
    entry = _one(cmd)
    assert decode_entry(encode_entry(entry)) == entry


@FEW
@given(deletes)
def test_delete_round_trip(cmd: Delete) -> None:
    entry = _one(cmd)
    assert decode_entry(encode_entry(entry)) == entry


@FEW
@given(wal_entries)
def test_entry_round_trip_keeps_types(entry: WalEntry) -> None:
    back = decode_entry(encode_entry(entry))
    assert back == entry
    assert isinstance(back.commands, tuple) and isinstance(back.txn.memo, tuple)
    for cmd in back.commands:
        if isinstance(cmd, UpdateCatalog):
            assert type(cmd.kind) is CatalogKind and type(cmd.reason) is CatalogReason
            if cmd.node.schema is not None:
                assert isinstance(cmd.node.schema.columns, tuple)
                assert all(type(c.type) is ColumnType for c in cmd.node.schema.columns)
        elif isinstance(cmd, Append):
            assert isinstance(cmd.infos, tuple)
        else:
            assert isinstance(cmd.rows, tuple)


@FEW
@given(wal_entries)
def test_generic_record_round_trip(entry: WalEntry) -> None:
    record = entry_to_record(entry)
    name, back = decode_record(encode_record("wal_entry", record))
    assert name == "wal_entry"
    assert back == record


@FEW
@given(arrow_tables())
def test_arrow_ipc_round_trip(table: pa.Table) -> None:
    back = ipc_to_table(table_to_ipc(table))
    assert back.schema.equals(table.schema)
    assert back.equals(table)


def _stream_writer_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


@FEW
@given(arrow_tables(), st.integers(0, 3))
def test_table_to_ipc_writes_what_a_stream_writer_writes(table: pa.Table, cut: int) -> None:
    """The one-batch fast path (schema message + batch message + end marker) and the
    writer give the same bytes: for a table, a slice of it, and a table of two chunks."""
    for t in (table, table.slice(min(cut, table.num_rows)), pa.concat_tables([table, table])):
        assert table_to_ipc(t) == _stream_writer_bytes(t)
        assert ipc_to_table(table_to_ipc(t)).equals(t)


@FEW
@given(st.data())
def test_append_batch_decodes_to_its_table(data: st.DataObject) -> None:
    schema = data.draw(table_schemas())
    table = data.draw(arrow_tables(schema))
    entry = _one(Append((AppendInfo(0, table.num_rows, Dest(1, 2, 3, 4), 0, table.num_rows),), table_to_ipc(table)))
    (cmd,) = decode_entry(encode_entry(entry)).commands
    assert isinstance(cmd, Append)
    assert ipc_to_table(cmd.batch).equals(table)


# --- the envelope -----------------------------------------------------------------------


def test_envelope_layout() -> None:
    data = encode_entry(_example())
    assert data[:2] == MAGIC == b"KW"
    assert data[2] == FORMAT_VERSION == 1
    assert data[3] == len("wal_entry") and data[4:13] == b"wal_entry"
    assert schema_of(data) == "wal_entry"
    assert "wal_entry" in known_schemas()


def test_unknown_version_is_refused_clearly() -> None:
    data = bytearray(encode_entry(_example()))
    data[2] = 9
    with pytest.raises(UnsupportedFormatError, match=r"version 9.*supports version\(s\) 1"):
        decode_entry(bytes(data))
    with pytest.raises(UnsupportedFormatError):
        decode_record(bytes(data))


def test_bad_magic_is_refused() -> None:
    data = b"XY" + encode_entry(_example())[2:]
    with pytest.raises(UnsupportedFormatError, match=r"not a kwal record.*b'XY"):
        decode_entry(data)
    with pytest.raises(UnsupportedFormatError, match="not a kwal record"):
        decode_record(b"")
    with pytest.raises(DecodeError, match="truncated kwal record header"):
        decode_record(b"KW\x01")


def test_unknown_schema_name_is_refused() -> None:
    data = MAGIC + bytes((FORMAT_VERSION, 4)) + b"nope" + b"\x00\x02"
    with pytest.raises(UnsupportedFormatError, match=r"unknown schema 'nope'.*wal_entry"):
        decode_record(data)
    with pytest.raises(UnsupportedFormatError, match="unknown schema 'nope'"):
        encode_record("nope", {})
    with pytest.raises(UnsupportedFormatError):
        encode_record("../wal_entry", {})


def test_wrong_expected_schema() -> None:
    other = MAGIC + bytes((FORMAT_VERSION, 11)) + b"txn_request" + b"\x00"
    with pytest.raises(UnexpectedSchemaError, match="expected a 'wal_entry' record, found 'txn_request'"):
        decode_entry(other)
    with pytest.raises(UnexpectedSchemaError):
        decode_record(encode_entry(_example()), expected="txn_request")


def test_every_truncation_is_an_error() -> None:
    data = encode_entry(_example())
    body_start = 4 + len("wal_entry")
    for cut in range(len(data)):
        with pytest.raises(CodecError):
            decode_entry(data[:cut])
    for cut in range(body_start, len(data)):
        with pytest.raises(DecodeError, match="'wal_entry'"):
            decode_entry(data[:cut])


def test_trailing_bytes_are_an_error() -> None:
    with pytest.raises(DecodeError, match="trailing"):
        decode_entry(encode_entry(_example()) + b"\x00")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_garbled_bodies_fail_cleanly(data: st.DataObject) -> None:
    """Flipped bytes either still decode (Avro has no checksum; the log format's
    CRC catches those) or raise a CodecError, never anything else."""
    raw = bytearray(encode_entry(_example()))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(13, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    try:
        decode_entry(bytes(raw))
    except CodecError:
        pass


def test_lsn_given_at_encode_time() -> None:
    entry = _example()
    assert decode_entry(encode_entry(entry, lsn=9)) == WalEntry(9, entry.txn, entry.commands)


def test_encode_errors() -> None:
    with pytest.raises(EncodeError, match="OverflowError"):
        encode_entry(WalEntry(1, TxnContext(2**63, 0)))
    with pytest.raises(EncodeError, match="not a WAL command"):
        encode_entry(_one("not a command"))
    with pytest.raises(EncodeError, match="'wal_entry'"):
        encode_record("wal_entry", {"lsn": "seven", "txn": {"start_ts": 1, "commit_ts": 2}})


def test_arrow_ipc_garbage_and_truncation() -> None:
    data = table_to_ipc(pa.table({"a": [1, 2, 3], "s": ["x", None, "z"]}))
    for cut in range(len(data)):
        with pytest.raises(DecodeError):
            ipc_to_table(data[:cut])
    with pytest.raises(DecodeError, match="Arrow IPC"):
        ipc_to_table(b"garbage" * 4 + b"\xff\xff\xff\xff\x00\x00\x00\x00")


# --- other schemas in the folder (as other components will add them) --------------------


@pytest.fixture
def schema_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(codec, "SCHEMA_DIR", tmp_path)
    monkeypatch.setattr(codec, "_cache", {})
    schema = {
        "type": "record",
        "name": "Probe",
        "namespace": "kwal.test",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "body", "type": [
                {"type": "record", "name": "Ping", "fields": [{"name": "n", "type": "long"}]},
                {"type": "record", "name": "Pong", "fields": [{"name": "s", "type": "string"}]},
            ]},
            {"name": "note", "type": ["null", "string"], "default": None},
        ],
    }
    (tmp_path / "probe.avsc").write_text(json.dumps(schema))
    return tmp_path


def test_a_new_avsc_file_is_a_new_record_type(schema_dir: Path) -> None:
    record = {"id": 5, "body": ("kwal.test.Pong", {"s": "hi"}), "note": None}
    data = encode_record("probe", record)
    assert decode_record(data, expected="probe") == ("probe", record)
    assert known_schemas() == ["probe"]
    with pytest.raises(UnexpectedSchemaError):
        decode_entry(data)


row_entries = st.builds(
    WalEntry,
    lsn=st.integers(1, 2**63 - 1),
    txn=st.builds(TxnContext, st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1),
                  st.lists(dests, max_size=5).map(tuple)),
    commands=st.lists(st.one_of(appends(), deletes), max_size=5).map(tuple),
)


@FEW
@given(row_entries, st.one_of(st.none(), st.integers(1, 2**63 - 1)))
def test_an_entry_that_writes_rows_is_written_as_the_codec_writes_it(entry: WalEntry, lsn: int | None) -> None:
    """Entries of Append and Delete commands are written by hand (`codec._rows_entry`):
    the very bytes fastavro writes, and they read back to the entry."""
    data = encode_entry(entry, lsn)
    written = entry if lsn is None else WalEntry(lsn, entry.txn, entry.commands)
    assert bytes(data) == encode_record("wal_entry", entry_to_record(written))
    assert decode_entry(bytes(data)) == written


def test_an_entry_that_writes_rows_and_does_not_fit_gets_the_codecs_error() -> None:
    append = Append((AppendInfo(0, 1, Dest(1, 2, 3, 4), 0, 1),), b"batch")
    for bad, match in (
        (WalEntry(1, TxnContext(2**63, 0), (append,)), "OverflowError"),
        (WalEntry(1, TxnContext(0, 0), (Delete(Dest(1, 2, 3, 4), (2**64,)),)), "OverflowError"),
        (WalEntry(1, TxnContext(0, 0), (Append(append.infos, "text"),)), "'wal_entry'"),  # type: ignore[arg-type]
    ):
        with pytest.raises(EncodeError, match=match):
            encode_entry(bad)
