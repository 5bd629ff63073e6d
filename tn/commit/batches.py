"""Arrow IPC bytes of the Append batches of a group of committing transactions.

The rows of many small transactions on one table (schema) are turned into one
Arrow record batch, and each transaction's rows are written as a slice of it:
the bytes are exactly what `schemas.arrow_ipc.table_to_ipc` writes for the same
rows (schema message, one record batch message, end-of-stream marker), at a
fraction of the per-transaction cost. Big batches go through `table_to_ipc`
directly; small ones that came in as Arrow tables are regrouped from their Python
values too, which is cheaper than one pyarrow writer per transaction.
"""

from __future__ import annotations

import itertools
import logging

import pyarrow as pa

from schemas.arrow_ipc import batch_to_ipc, schema_message, table_to_ipc
from schemas.wal import TableSchema
from tn.txn.rows import Batch, arrow_schema

log = logging.getLogger(__name__)

_SMALL = 256  # rows; bigger batches are serialized on their own

_schema_bytes: dict[int, tuple[TableSchema, bytes]] = {}  # by id(schema), see rows.arrow_schema


def _schema_message(schema: TableSchema) -> bytes:
    e = _schema_bytes.get(id(schema))
    if e is None or e[0] is not schema:
        if len(_schema_bytes) > 4096:
            _schema_bytes.clear()
        b = schema_message(arrow_schema(schema))
        _schema_bytes[id(schema)] = (schema, b)
        return b
    return e[1]


def serialize(batches: list[Batch]) -> None:
    """Set `ipc` on every batch that has none yet."""
    groups: dict[int, list[Batch]] = {}  # by id(schema): same object, same group
    for b in batches:
        if b.ipc is not None:
            continue
        if b.n > _SMALL or b.columnar:  # its rows are Arrow already: written as they are
            b.ipc = table_to_ipc(b.arrow())
        else:
            groups.setdefault(id(b.schema), []).append(b)
    for group in groups.values():
        schema = group[0].schema
        target = arrow_schema(schema)
        try:
            arrays = [
                pa.array(list(itertools.chain.from_iterable(b.cols[i] for b in group)), type=f.type)
                for i, f in enumerate(target)
            ]
            rb = pa.RecordBatch.from_arrays(arrays, schema=target)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            log.exception("grouped Arrow conversion failed; serializing one by one")
            for b in group:
                b.ipc = table_to_ipc(b.arrow())
            continue
        head = _schema_message(schema)
        off = 0
        for b in group:
            b.ipc = batch_to_ipc(head, rb.slice(off, b.n))
            off += b.n
