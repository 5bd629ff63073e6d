"""TxnRequest / TxnResult: what producers send to the TN and what it answers.

The in-memory form is the dataclasses below; `encode_request`/`decode_request`
and `encode_result`/`decode_result` turn them into the codec's versioned Avro
envelope (`txn_request.avsc`, `txn_result.avsc`) and back. Row batches and
delete keys travel as Arrow IPC streams (`schemas.arrow_ipc`).

Topics and keys: a request goes to the requests topic keyed by its client id;
its result to the results topic keyed by the request id -- or, for a client that
asks for it (request header ``kwal-results: batch``), several results of that
client in ONE `txn_result_batch` record keyed by the client id
(`encode_results`; `decode_results` reads either form).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import pyarrow as pa

from schemas.arrow_ipc import ipc_to_table, table_to_ipc
from schemas.codec import decode_record, encode_record, schema_of

REQUEST_SCHEMA = "txn_request"
# v2 adds `objects` to an op (a large transaction's rows in object storage); a request
# without one is still written as v1, so every earlier reader keeps reading it.
REQUEST_SCHEMA_V2 = "txn_request_v2"
REQUEST_SCHEMAS = (REQUEST_SCHEMA, REQUEST_SCHEMA_V2)
RESULT_SCHEMA = "txn_result"
# several results of one client in one record (a client that sent RESULTS_HEADER=batch)
RESULT_BATCH_SCHEMA = "txn_result_batch"
RESULT_SCHEMAS = (RESULT_SCHEMA, RESULT_BATCH_SCHEMA)
# The request header by which a client says it reads RESULT_BATCH_SCHEMA records: the
# TN answers a request without it with one `txn_result` record, as every earlier
# client expects.
RESULTS_HEADER = "kwal-results"
RESULTS_BATCH = b"batch"


class OpKind(StrEnum):
    CREATE_DATABASE = "CREATE_DATABASE"
    DROP_DATABASE = "DROP_DATABASE"
    CREATE_TABLE = "CREATE_TABLE"
    DROP_TABLE = "DROP_TABLE"
    ADD_COLUMN = "ADD_COLUMN"
    DROP_COLUMN = "DROP_COLUMN"
    INSERT = "INSERT"
    DELETE = "DELETE"
    UPDATE = "UPDATE"


_OP_KINDS = {k.value: k for k in OpKind}  # a dict lookup: cheaper than the enum's call


class Status(StrEnum):
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"


class Kind(StrEnum):
    """The category of an abort; the client maps it to an exception class."""

    NONE = ""
    CONFLICT = "conflict"
    VALIDATION = "validation"
    PERMISSION = "permission"
    INTERNAL = "internal"


class Reason:
    """Abort reason codes the TN itself produces. Engine errors pass their own
    `TnError.code` through unchanged (kind from their class)."""

    CONFLICT = "write_conflict"
    UNDECODABLE = "undecodable"
    UNSUPPORTED_VERSION = "unsupported_version"
    TOO_LARGE = "oversized"
    INVALID_REQUEST = "bad_request"  # decodes, but the ops make no sense (no table, bad keys, ...)
    UNKNOWN_DATABASE = "unknown_database"
    UNKNOWN_TABLE = "unknown_table"
    UNKNOWN_COLUMN = "bad_column"
    TYPE_MISMATCH = "type_mismatch"
    MISSING_PRIMARY_KEY = "missing_primary_key"
    VALIDATION = "bad_request"
    SHUTTING_DOWN = "engine_closed"
    FORGED_CLIENT = "forged_client"  # secure mode: the client id is not the sender's principal
    INTERNAL = "internal"


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str


@dataclass(frozen=True, slots=True)
class TxnOp:
    """One operation. Which fields matter depends on `kind`:

    - CREATE_DATABASE / DROP_DATABASE: database
    - CREATE_TABLE: database, table, columns, primary_key
    - DROP_TABLE: database, table
    - ADD_COLUMN: database, table, columns[0] (name and type)
    - DROP_COLUMN: database, table, columns[0].name
    - INSERT / UPDATE: database, table, rows
    - INSERT of a large transaction: database, table, objects (object-store keys of
      Parquet files with the rows; rows None; docs/large-transactions.md)
    - DELETE: database, table, keys (primary-key values)
    """

    kind: OpKind
    database: str
    table: str = ""
    columns: tuple[Column, ...] = ()
    primary_key: str = ""
    rows: pa.Table | None = None
    keys: tuple[Any, ...] | None = None
    objects: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TxnRequest:
    request_id: str
    client_id: str
    ops: tuple[TxnOp, ...] = field(default_factory=tuple)
    sent_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class TxnResult:
    request_id: str
    status: Status
    commit_ts: int = 0
    kind: Kind = Kind.NONE
    reason: str = ""
    message: str = ""
    client_id: str = ""
    request_offset: int = -1

    @property
    def committed(self) -> bool:
        return self.status is Status.COMMITTED

    @classmethod
    def ok(cls, request_id: str, commit_ts: int, **kw: Any) -> TxnResult:
        return cls(request_id, Status.COMMITTED, commit_ts=commit_ts, **kw)

    @classmethod
    def aborted(
        cls, request_id: str, kind: Kind, reason: str, message: str, **kw: Any
    ) -> TxnResult:
        return cls(request_id, Status.ABORTED, kind=kind, reason=reason, message=message, **kw)


class RequestFormatError(ValueError):
    """The envelope decoded but its content cannot be turned into a request
    (e.g. a row batch that is not Arrow IPC)."""


# ---- to/from the codec's dicts -------------------------------------------------------------


def _keys_to_ipc(keys: tuple[Any, ...]) -> bytes:
    return table_to_ipc(pa.table({"key": pa.array(list(keys))}))


def request_to_dict(req: TxnRequest) -> dict[str, Any]:
    ops: list[dict[str, Any]] = []
    for op in req.ops:
        ops.append(
            {
                "kind": op.kind.value,
                "database": op.database,
                "table": op.table,
                "columns": [{"name": c.name, "type": c.type} for c in op.columns],
                "primary_key": op.primary_key,
                "rows": table_to_ipc(op.rows) if op.rows is not None else None,
                "keys": _keys_to_ipc(op.keys) if op.keys is not None else None,
            }
        )
        if op.objects:
            ops[-1]["objects"] = list(op.objects)
    return {
        "request_id": req.request_id,
        "client_id": req.client_id,
        "sent_at_ms": req.sent_at_ms,
        "ops": ops,
    }


def request_from_dict(d: dict[str, Any]) -> TxnRequest:
    ops = []
    for i, o in enumerate(d["ops"]):
        try:
            rows = ipc_to_table(o["rows"]) if o.get("rows") is not None else None
            keys_table = ipc_to_table(o["keys"]) if o.get("keys") is not None else None
        except Exception as e:  # pyarrow raises several types on garbage
            raise RequestFormatError(f"op {i}: row batch is not an Arrow IPC stream: {e}") from e
        keys: tuple[Any, ...] | None = None
        cols = o.get("columns")
        if keys_table is not None:
            if keys_table.num_columns != 1:
                raise RequestFormatError(f"op {i}: keys must be one column")
            keys = tuple(keys_table.column(0).to_pylist())
        ops.append(
            TxnOp(
                kind=_OP_KINDS.get(o["kind"]) or OpKind(o["kind"]),  # (unknown: ValueError)
                database=o["database"],
                table=o.get("table", ""),
                columns=tuple([Column(c["name"], c["type"]) for c in cols]) if cols else (),
                primary_key=o.get("primary_key", ""),
                rows=rows,
                keys=keys,
                objects=tuple(o.get("objects", ())),
            )
        )
    return TxnRequest(
        request_id=d["request_id"],
        client_id=d["client_id"],
        ops=tuple(ops),
        sent_at_ms=int(d.get("sent_at_ms", 0)),
    )


def result_to_dict(res: TxnResult) -> dict[str, Any]:
    return {
        "request_id": res.request_id,
        "client_id": res.client_id,
        "status": res.status.value,
        "commit_ts": res.commit_ts,
        "kind": res.kind.value,
        "reason": res.reason,
        "message": res.message,
        "request_offset": res.request_offset,
    }


def result_from_dict(d: dict[str, Any]) -> TxnResult:
    return TxnResult(
        request_id=d["request_id"],
        status=Status(d["status"]),
        commit_ts=int(d.get("commit_ts", 0)),
        kind=Kind(d.get("kind", ""))
        if d.get("kind", "") in Kind._value2member_map_
        else Kind.INTERNAL,
        reason=d.get("reason", ""),
        message=d.get("message", ""),
        client_id=d.get("client_id", ""),
        request_offset=int(d.get("request_offset", -1)),
    )


def encode_request(req: TxnRequest) -> bytes:
    """v1 (`txn_request`) unless an op names objects (then `txn_request_v2`)."""
    d = request_to_dict(req)
    if any("objects" in op for op in d["ops"]):
        for op in d["ops"]:
            op.setdefault("objects", [])
        return encode_record(REQUEST_SCHEMA_V2, d)
    return encode_record(REQUEST_SCHEMA, d)


def decode_request(data: bytes) -> TxnRequest:
    """Either version. Raises the codec's errors (DecodeError, UnsupportedFormatError,
    UnexpectedSchemaError) or RequestFormatError."""
    if schema_of(data) not in REQUEST_SCHEMAS:
        decode_record(data, REQUEST_SCHEMA)  # raises UnexpectedSchemaError naming both
    _, d = decode_record(data)
    return request_from_dict(d)


def encode_result(res: TxnResult) -> bytes:
    return encode_record(RESULT_SCHEMA, result_to_dict(res))


def decode_result(data: bytes) -> TxnResult:
    _, d = decode_record(data, RESULT_SCHEMA)
    return result_from_dict(d)


def encode_results(results: list[TxnResult]) -> bytes:
    """Several results (of one client) as ONE `txn_result_batch` record."""
    return encode_record(RESULT_BATCH_SCHEMA, {"results": [result_to_dict(r) for r in results]})


def decode_results(data: bytes) -> list[TxnResult]:
    """The results in a results-topic record of either form (`txn_result`: one;
    `txn_result_batch`: several). Raises the codec's errors."""
    if schema_of(data) not in RESULT_SCHEMAS:
        decode_record(data, RESULT_SCHEMA)  # raises UnexpectedSchemaError naming it
    name, d = decode_record(data)
    if name == RESULT_SCHEMA:
        return [result_from_dict(d)]
    return [result_from_dict(r) for r in d["results"]]


def peek_request_id(data: bytes) -> str | None:
    """The request id of a txn_request envelope whose body may not decode in
    full (garbled ops, oversized): the id is the body's first field, an Avro
    string (zig-zag varint length, then UTF-8). None when even that fails."""
    try:
        if len(data) < 4 or data[:2] != b"KW":
            return None
        end = 4 + data[3]
        if data[4:end] not in (REQUEST_SCHEMA.encode(), REQUEST_SCHEMA_V2.encode()):
            return None
        shift = 0
        raw = 0
        pos = end
        while True:
            b = data[pos]
            pos += 1
            raw |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
            if shift > 63:
                return None
        length = (raw >> 1) ^ -(raw & 1)
        if length <= 0 or length > 256 or pos + length > len(data):
            return None
        return data[pos : pos + length].decode("utf-8")
    except (IndexError, UnicodeDecodeError):
        return None
