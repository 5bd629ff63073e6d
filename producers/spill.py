"""Large transactions on the client side (docs/large-transactions.md): rows through the
object store, references over Kafka.

A request travels as one Kafka record, which cannot hold a large transaction. So, in
`Transaction.commit_async`, before anything is sent:

1. `check_size`: the transaction's rows (Arrow bytes of every INSERT/UPDATE batch and
   DELETE key list) above `client.max_txn_bytes` -> ValidationError naming the limit;
   nothing is written anywhere.
2. `spill`, when they are above `client.spill_bytes`: every INSERT's rows are written
   to the object store as Parquet objects of at most `client.object_rows` rows each
   (one object encoded at a time: the caller's table plus one object's bytes are in
   memory, never a second copy of the whole transaction), and the INSERT op then names
   those objects instead of carrying rows.
3. the request (`txn_request_v2`, keys only) goes to the TN, which validates each object
   against the table, lays its rows out as block objects and commits them with the
   transaction's other ops in one WAL entry (object references only).
4. `discard`: once the TN has answered (committed or aborted), the uploads are deleted:
   the TN no longer needs them (a commit references the block objects it wrote; a repeat
   of the request id is answered from the TN's memory of ids, not by running it again).
   After a timeout they stay, so that a retry with the same request id can still run.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from infra.config import ClientConfig
from infra.objectstore import ObjectStore
from producers.exceptions import ValidationError
from schemas.requests import OpKind, TxnOp


def _table_bytes_exact(rows: pa.Table) -> int:
    return int(rows.nbytes)


def _table_bytes_bound(rows: pa.Table) -> int:
    """An upper bound of `Table.nbytes`, without its cost: `nbytes` walks every buffer
    range (5.5 us for a one-row table, 8% of a one-row commit's client CPU), while
    `get_total_buffer_size` (0.2 us) sums each buffer once. That sum can fall short of
    `nbytes` only where chunks or columns share a buffer (each counts the shared part), so
    it is multiplied by the table's chunk count: no column chunk references more than the
    whole of the buffers."""
    chunks = sum(c.num_chunks for c in rows.columns)
    return int(rows.get_total_buffer_size()) * max(1, chunks)


def rows_bytes(ops: Sequence[TxnOp], table_bytes: Callable[[pa.Table], int] = _table_bytes_exact) -> int:
    """The Arrow bytes of a transaction's rows and delete keys (what counts for the
    limits), each table measured by `table_bytes`."""
    total = 0
    for op in ops:
        if op.rows is not None:
            total += table_bytes(op.rows)
        if op.keys is not None:
            total += 8 * len(op.keys)
    return total


def rows_bytes_bound(ops: Sequence[TxnOp]) -> int:
    """An upper bound of `rows_bytes`, at a fraction of its cost (`_table_bytes_bound`)."""
    return rows_bytes(ops, _table_bytes_bound)


def check_size(ops: Sequence[TxnOp], cfg: ClientConfig, request_id: str) -> int:
    """Step 1: the transaction's row bytes, or ValidationError above `client.max_txn_bytes`.

    The exact figure only where it decides something: a transaction whose upper bound
    (`rows_bytes_bound`) is below both limits gets the bound back, which spills nothing
    and refuses nothing, as the exact figure would not."""
    bound = rows_bytes_bound(ops)
    if bound <= min(cfg.spill_bytes, cfg.max_txn_bytes):
        return bound
    size = rows_bytes(ops)
    if size > cfg.max_txn_bytes:
        raise ValidationError(
            f"transaction {request_id} holds {size} bytes of rows, above "
            f"client.max_txn_bytes={cfg.max_txn_bytes}: split it into smaller transactions",
            code="oversized",
            request_id=request_id,
        )
    return size


def needs_spill(size: int, cfg: ClientConfig) -> bool:
    return size > cfg.spill_bytes


def spill(
    ops: Sequence[TxnOp],
    store: ObjectStore,
    cfg: ClientConfig,
    client_id: str,
    request_id: str,
) -> tuple[list[TxnOp], list[str]]:
    """Step 2: the ops with every INSERT's rows moved to objects, and the objects' keys.
    A transaction that also updates or deletes in a table it inserts into this way is
    refused (ValidationError): the TN takes a spilled table's rows from objects only."""
    spilled = {(op.database, op.table) for op in ops if op.kind is OpKind.INSERT}
    for op in ops:
        if op.kind in (OpKind.UPDATE, OpKind.DELETE) and (op.database, op.table) in spilled:
            raise ValidationError(
                f"transaction {request_id} is large (its rows go through the object store) "
                f"and both inserts into and {op.kind.value.lower()}s {op.database}.{op.table}: "
                "commit the change in a transaction of its own",
                code="bad_request",
                request_id=request_id,
            )
    step = max(1, cfg.object_rows)
    out: list[TxnOp] = []
    keys: list[str] = []
    try:
        for i, op in enumerate(ops):
            if op.kind is not OpKind.INSERT or op.rows is None:
                out.append(op)
                continue
            mine = []
            for n, first in enumerate(range(0, max(op.rows.num_rows, 1), step)):
                key = f"{cfg.spill_prefix}/{client_id}/{request_id}/{i}-{n}.parquet"
                store.put(key, _parquet(op.rows.slice(first, step)))
                keys.append(key)
                mine.append(key)
            out.append(TxnOp(OpKind.INSERT, op.database, op.table, objects=tuple(mine)))
    except Exception:
        discard(store, keys)
        raise
    return out, keys


def _parquet(rows: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(rows, buf, compression="lz4")
    return buf.getvalue()


def discard(store: ObjectStore, keys: Sequence[str]) -> None:
    """Step 4: delete the uploads (best effort: a leftover is garbage, never state)."""
    for key in keys:
        try:
            store.delete(key)
        except Exception:  # noqa: BLE001 - the store may be away; nothing depends on it
            pass
