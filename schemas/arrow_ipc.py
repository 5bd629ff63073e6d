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
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def table_to_ipc(table: pa.Table) -> bytes:
    """Serialize `table` (schema and all its record batches) as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def ipc_to_table(data: bytes, validate: bool = True) -> pa.Table:
    """Read an Arrow IPC stream back into a table.

    With `validate` (the default) the buffers are checked in full, so garbled
    bytes raise `DecodeError` here instead of surfacing later as wrong values
    or a crash inside Arrow's compute kernels.
    """
    if not data.endswith(_END_OF_STREAM):
        raise DecodeError(f"truncated Arrow IPC stream ({len(data)} bytes): no end-of-stream marker")
    try:
        with pa.ipc.open_stream(pa.py_buffer(data)) as reader:
            table = reader.read_all()
        if validate:
            table.validate(full=True)
    except (pa.ArrowException, ValueError, OSError) as e:
        raise DecodeError(f"not a valid Arrow IPC stream ({len(data)} bytes): {e}") from e
    return table
