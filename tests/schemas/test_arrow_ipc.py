"""`schemas.arrow_ipc.ipc_to_table`: the message-by-message reader and its fallback."""

from __future__ import annotations

import pyarrow as pa
import pytest

from schemas.arrow_ipc import ipc_to_table, table_to_ipc
from schemas.exceptions import DecodeError


def _stream(table: pa.Table, chunk: int | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=chunk)
    return sink.getvalue().to_pybytes()


TABLE = pa.table({"id": pa.array(range(10), pa.int64()), "v": pa.array([str(i) for i in range(10)])})


@pytest.mark.parametrize("chunk", [None, 3, 1])
def test_streams_of_one_or_many_batches_read_back_equal(chunk: int | None) -> None:
    data = _stream(TABLE, chunk)
    got = ipc_to_table(data)
    assert got.equals(TABLE)
    assert got.column("id").num_chunks == (1 if chunk is None else -(-10 // chunk))
    assert ipc_to_table(table_to_ipc(TABLE)).equals(TABLE)


def test_an_empty_table_keeps_its_schema() -> None:
    got = ipc_to_table(table_to_ipc(TABLE.slice(0, 0)))
    assert got.num_rows == 0 and got.schema == TABLE.schema


def test_a_stream_with_a_dictionary_batch_is_read_by_the_full_reader() -> None:
    table = pa.table({"c": pa.array(["a", "b", "a"]).dictionary_encode()})
    assert ipc_to_table(_stream(table)).equals(table)


@pytest.mark.parametrize("cut", [9, 40, -9])
def test_a_cut_stream_is_refused(cut: int) -> None:
    with pytest.raises(DecodeError):
        ipc_to_table(table_to_ipc(TABLE)[:cut])


@pytest.mark.parametrize("at", [0, 4, 9])
def test_a_garbled_message_header_is_refused(at: int) -> None:
    garbled = bytearray(table_to_ipc(TABLE))
    garbled[at] ^= 0xFF
    with pytest.raises(DecodeError):
        ipc_to_table(bytes(garbled))


def test_streams_of_alternating_schemas_read_back_with_their_own_schema() -> None:
    """The schema cache (keyed by the schema message's bytes) gives each stream its own
    schema, also when streams of two tables (and a renamed column) alternate."""
    other = pa.table({"id": pa.array([1, 2], pa.int64()), "w": pa.array([0.5, 1.5])})
    renamed = TABLE.rename_columns(["id", "v2"])
    for _ in range(3):
        for table in (TABLE, other, renamed):
            got = ipc_to_table(table_to_ipc(table))
            assert got.equals(table) and got.schema.names == table.schema.names


@pytest.mark.parametrize("at", [0, 4, 5])
def test_a_garbled_schema_frame_is_refused_once_the_schema_is_cached(at: int) -> None:
    data = table_to_ipc(TABLE)
    assert ipc_to_table(data).equals(TABLE)  # cached now
    garbled = bytearray(data)
    garbled[at] ^= 0xFF
    with pytest.raises(DecodeError):
        ipc_to_table(bytes(garbled))


@pytest.mark.parametrize("chunks", [(10,), (3, 7), (10, 0)])
def test_table_to_ipc_writes_what_a_stream_writer_writes(chunks: tuple[int, ...]) -> None:
    """One batch is written without the writer; any other chunking by the writer."""
    ids = pa.chunked_array([pa.array(range(n), pa.int64()) for n in chunks], pa.int64())
    table = pa.table({"id": ids, "v": pa.array([str(i) for i in range(sum(chunks))])})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    assert table_to_ipc(table) == sink.getvalue().to_pybytes()


def test_a_message_length_framing_past_the_end_is_refused() -> None:
    """A damaged metadata length that frames the schema message past the stream's end:
    `pa.ipc.read_message` raises EOFError there, which must reach callers as the codec's
    DecodeError (a hypothesis run of tests/schemas/test_wal_record.py found it)."""
    table = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", None]})
    data = bytearray(table_to_ipc(table))
    data[4] = 0xF7
    with pytest.raises(DecodeError, match="End of Arrow stream"):
        ipc_to_table(bytes(data))


@pytest.mark.parametrize("kind", ["top level", "nested", "dictionary stream"])
def test_a_field_name_that_is_no_utf8_is_refused(kind: str) -> None:
    """A damaged byte in a field's name (top level or inside a struct; a stream with a
    dictionary goes through pyarrow's own reader): Arrow reads and validates it, and the
    first lookup of the name would raise UnicodeDecodeError far from the decoding. The
    codec refuses it (hypothesis found one in a damaged request, tests/schemas/
    test_requests_avro.py)."""
    if kind == "top level":
        table = pa.table({"qqname": [1, 2]})
    elif kind == "nested":
        table = pa.table({"s": pa.array([{"qqname": 1}], pa.struct([("qqname", pa.int64())]))})
    else:
        table = pa.table({"qqname": pa.array(["a", "b"]).dictionary_encode()})
    data = table_to_ipc(table)
    assert data.count(b"qqname") == 1
    bad = data.replace(b"qqname", b"q\x80name")
    with pytest.raises(DecodeError, match="utf-8"):
        ipc_to_table(bad)


@pytest.mark.parametrize("kind", ["one batch", "several batches", "dictionary"])
def test_a_batch_that_only_a_full_check_refuses_is_refused(kind: str) -> None:
    """Bytes that are no UTF-8 in a string column: the framing and the buffers' sizes are
    intact, so only the full check of the batches (of the table, in the full reader's
    fallback) finds them; unchecked, the same bytes read."""
    values = pa.array(["héllo", "b", "c", "d"])
    table = pa.table({"v": values.dictionary_encode() if kind == "dictionary" else values})
    data = _stream(table, 2 if kind == "several batches" else None)
    garbled = data.replace("é".encode(), b"\xff\xfe")
    assert garbled != data
    assert ipc_to_table(garbled, validate=False).num_rows == 4
    with pytest.raises(DecodeError, match="UTF8|UTF-8|utf8|utf-8"):
        ipc_to_table(garbled)
