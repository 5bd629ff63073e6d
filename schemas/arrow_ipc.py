"""Row batches as Arrow IPC bytes (the ``batch`` of a WAL Append, logtail inserts).

The IPC *stream* format is used (not the file format): it needs no footer, so
a batch can be written in one pass and read from a plain ``bytes``.
"""

from __future__ import annotations

import pyarrow as pa

from schemas.exceptions import DecodeError
from schemas.wal import ColumnType, TableSchema

# The Arrow type of each column type, everywhere: TN batches, logtail, Parquet blocks, CNs.
ARROW_TYPES: dict[ColumnType, pa.DataType] = {
    ColumnType.INT64: pa.int64(),
    ColumnType.FLOAT64: pa.float64(),
    ColumnType.STRING: pa.string(),
    ColumnType.BOOL: pa.bool_(),
    ColumnType.BINARY: pa.binary(),
    ColumnType.TIMESTAMP: pa.timestamp("us", tz="UTC"),
}


def arrow_schema(schema: TableSchema) -> pa.Schema:
    """The Arrow schema of a table's user columns, in column order."""
    return pa.schema([pa.field(c.name, ARROW_TYPES[c.type], c.nullable) for c in schema.columns])


# What a stream writer puts last: continuation marker + zero-length message. A
# stream cut right after a complete message is otherwise indistinguishable from
# a shorter stream (cut after the schema it reads as an empty table).
_CONTINUATION = b"\xff\xff\xff\xff"  # what starts every encapsulated message
_END_OF_STREAM = _CONTINUATION + bytes(4)


def preload() -> None:
    """Pay pyarrow's one-time lazy imports now: its first conversion from Python
    values imports pandas (to check for array-likes), ~0.4 s on this machine.
    A process that serves (the TN, a CN) calls this while starting, so that the
    first transaction or the first applied record does not stall for it."""
    pa.array([0])


def schema_message(schema: pa.Schema) -> bytes:
    """The IPC stream's first message for `schema` (what a stream writer writes first).

    Not cached: telling a schema seen before from another (`equals` with metadata, which
    the message carries) costs a fresh schema object ~3 us, more than serializing it
    (~2.4 us, measured)."""
    return schema.serialize().to_pybytes()


def batch_to_ipc(head: bytes, batch: pa.RecordBatch) -> bytes:
    """One record batch as an Arrow IPC stream, given its schema's `schema_message`:
    the same bytes a stream writer would produce, without the writer (~2x cheaper
    for a small batch, which is what most transactions carry)."""
    return head + batch.serialize().to_pybytes() + _END_OF_STREAM


def table_to_ipc(table: pa.Table) -> bytes:
    """Serialize `table` (schema and all its record batches) as an Arrow IPC stream."""
    # one batch (every column one chunk): what the writer would write, without the writer
    batches = table.to_batches()
    if len(batches) == 1 and table.num_rows:
        return batch_to_ipc(schema_message(table.schema), batches[0])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def split_stream(data: bytes) -> tuple[bytes, bytes] | None:
    """A stream's schema message and the messages after it (without the end-of-stream
    marker), by their framing alone; None when `data` is not framed so (then decode it).

    Why: the WAL writer joins the batches of a record's entries of one schema into
    one stream by splicing these bytes, so the commit path pays no Arrow decoding per
    entry (`schemas.wal_record`)."""
    if data[:4] != _CONTINUATION or len(data) < 16 or not data.endswith(_END_OF_STREAM):
        return None
    end = 8 + int.from_bytes(data[4:8], "little")
    if end > len(data) - len(_END_OF_STREAM):
        return None
    return data[:end], data[end : len(data) - len(_END_OF_STREAM)]


def join_stream(schema_msg: bytes, bodies: list[bytes]) -> bytes:
    """`split_stream`'s inverse over several streams of the same schema message."""
    return schema_msg + b"".join(bodies) + _END_OF_STREAM


# The last stream read (`ipc_to_table`): the entries of one WAL record share one batch,
# each naming its rows in it, and every reader of those entries asks for it in turn.
# Small streams are cheap to read again and not shared; a big one is not kept alive
# after its reader is done with it.
_last: tuple[bytes, bool, pa.Table] | None = None
_CACHED_MIN, _CACHED_MAX = 64, 4 << 20


def ipc_to_table(data: bytes, validate: bool = True) -> pa.Table:
    """Read an Arrow IPC stream back into a table.

    With `validate` (the default) the buffers are checked in full, so garbled
    bytes raise `DecodeError` here instead of surfacing later as wrong values
    or a crash inside Arrow's compute kernels. The same bytes object asked for
    again is answered from a one-slot cache (a WAL record's entries share one).
    """
    global _last
    last = _last
    if last is not None and last[0] is data and (last[1] or not validate):
        return last[2]
    table = _ipc_to_table(data, validate)
    if _CACHED_MIN < len(data) <= _CACHED_MAX:
        _last = (data, validate, table)
    return table


def _ipc_to_table(data: bytes, validate: bool) -> pa.Table:
    if not data.endswith(_END_OF_STREAM):
        raise DecodeError(
            f"truncated Arrow IPC stream ({len(data)} bytes): no end-of-stream marker"
        )
    try:
        table = _read_stream(data, validate)
    # EOFError: `pa.ipc.read_message` where a damaged length frames a message past the end
    except (pa.ArrowException, ValueError, OSError, EOFError) as e:
        raise DecodeError(f"not a valid Arrow IPC stream ({len(data)} bytes): {e}") from e
    return table


_SCHEMAS: dict[bytes, pa.Schema] = {}  # schema message bytes -> schema (`_read_schema`)
_SCHEMAS_MAX = 1024


def _read_schema(data: bytes, reader: pa.BufferReader) -> pa.Schema:
    """The stream's schema, from its first message; `reader` is left after that message.

    Why a cache: every entry and logtail record starts with its table's schema message,
    the same bytes record after record, and parsing it is ~6 us of the ~28 us a 10-row
    stream costs to read (measured). The message is framed as continuation marker, int32
    metadata length, metadata; a schema message has no body, so those bytes are the whole
    message and its key. Anything else is parsed as before."""
    key = b""
    if data[:4] == _CONTINUATION and len(data) >= 8:
        key = data[: 8 + int.from_bytes(data[4:8], "little")]
        schema = _SCHEMAS.get(key)
        if schema is not None:
            reader.seek(len(key))
            return schema
    message = pa.ipc.read_message(reader)
    schema = _named_in_utf8(pa.ipc.read_schema(message))
    if key and message.type == "schema" and reader.tell() == len(key):
        if len(_SCHEMAS) >= _SCHEMAS_MAX:
            _SCHEMAS.clear()  # schemas change rarely: a full cache means churn, start over
        _SCHEMAS[key] = schema
    return schema


def _named_in_utf8(schema: pa.Schema) -> pa.Schema:
    """`schema`, once every field name in it (nested ones too) reads as UTF-8:
    UnicodeDecodeError otherwise. Arrow's reader and its full validation take a name's
    bytes as they come; the first code to ask for the name (a column lookup, a comparison)
    would raise, far from the decoding (hypothesis found such a damaged request)."""
    fields = list(schema)
    while fields:
        field = fields.pop()
        field.name  # noqa: B018 - decodes the name: the check
        kind = field.type
        fields.extend(kind.field(i) for i in range(kind.num_fields))
    return schema


def _read_stream(data: bytes, validate: bool) -> pa.Table:
    """The stream's schema message, then its record batches, message by message; with
    `validate`, every batch checked in full as it is read.

    Why not `pa.ipc.open_stream(...).read_all()`: that reader's setup is most of
    the cost of the one-row batches most entries carry (17 us against 6 us per
    stream measured on this machine; replay and every CN decode one per entry).
    A stream with any other message (a dictionary batch), or whose messages do
    not end exactly at the end-of-stream marker, is read by that reader, as before.

    Why the batches are checked and not the table: a fresh table's full check builds
    its columns' chunked arrays to walk them, ~3.4 us against ~0.3 us for its one
    batch's (measured, a one-row stream; the TN reads one per request). The table is
    made of exactly those batches, each of the schema (`from_batches` checks that).
    """
    reader = pa.BufferReader(data)
    schema = _read_schema(data, reader)
    end = len(data) - len(_END_OF_STREAM)
    batches = []
    while reader.tell() < end:
        message = pa.ipc.read_message(reader)
        if message.type != "record batch":
            break
        batch = pa.ipc.read_record_batch(message, schema)
        if validate:
            batch.validate(full=True)
        batches.append(batch)
    else:
        if reader.tell() == end:
            return pa.Table.from_batches(batches, schema)
    with pa.ipc.open_stream(pa.py_buffer(data)) as full:
        table = full.read_all()
    _named_in_utf8(table.schema)
    if validate:
        table.validate(full=True)
    return table
