"""Turning a decoded TxnRequest into engine calls, and errors into TxnResults.

Validation here is a first line only: the engine validates everything again
(it is the authority on the catalog). What the service checks itself, against
the committed schema of tables that already exist, is what a client can get
wrong in a batch: unknown columns, a missing or null primary key, and types
that do not fit the column (only lossless widening is accepted: null to
anything, integers to a wider integer or to float, float32 to float64).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from infra.objectstore import ObjectStore
from schemas.requests import Kind, OpKind, Reason, TxnOp, TxnRequest, TxnResult
from schemas.wal import TableSchema
from tn.checkpoint.compaction import add_objects, committed_table, prepare_object
from tn.checkpoint.exceptions import LargeTxnError
from tn.exceptions import ConflictError, EngineClosedError, TnError
from tn.exceptions import ValidationError as EngineValidationError

_ARROW = {
    "int64": pa.int64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "bool": pa.bool_(),
    "binary": pa.binary(),
}


class RequestInvalid(Exception):
    """Raised by the service's own checks; becomes an aborted validation result."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _fits(have: pa.DataType, want: pa.DataType) -> bool:
    if have == want or pa.types.is_null(have):
        return True
    if pa.types.is_integer(have) and (pa.types.is_integer(want) or pa.types.is_floating(want)):
        return True
    if pa.types.is_floating(have) and pa.types.is_floating(want):
        return True
    if pa.types.is_large_string(have) and pa.types.is_string(want):
        return True
    if pa.types.is_large_binary(have) and pa.types.is_binary(want):
        return True
    return False


@dataclass(frozen=True, slots=True)
class Plan:
    """What `conform_rows` does with rows of one Arrow schema for one table schema (the
    same for every request that sends that schema: computed once, `_plan`)."""

    error: RequestInvalid | None  # the rows' schema does not fit the table's
    target: pa.Schema | None  # cast to this (None: the rows fit as they are)
    pk: int  # the primary key's column index in the rows (-1: none; then `error`)
    # the rows hold every column of the table, `order` lists them in the table's
    # order (None: they are in it already) -- what a group member needs (grouping)
    complete: bool
    order: list[str] | None
    pk_at: int  # the primary key's column index in the table's order


_WHERE = "\0"  # in a cached plan's error message: the table's name, filled in per request
_plans: dict[int, tuple[TableSchema, list[tuple[pa.Schema, Plan]]]] = {}
_PLANS_MAX = 4096


def _plan(schema: TableSchema, have: pa.Schema) -> Plan:
    """The cached `Plan` for rows of schema `have` into a table of `schema` (by id: a
    table schema is one object per version; comparing Arrow schemas is cheap, hashing
    one is not)."""
    e = _plans.get(id(schema))
    if e is None or e[0] is not schema:
        if len(_plans) >= _PLANS_MAX:
            _plans.clear()
        e = _plans[id(schema)] = (schema, [])
    for s, plan in e[1]:
        if s.equals(have):
            return plan
    plan = _make_plan(schema, have)
    if len(e[1]) < 16:
        e[1].append((have, plan))
    return plan


def _make_plan(schema: TableSchema, have: pa.Schema) -> Plan:
    names = have.names
    types = {c.name: getattr(c.type, "value", c.type) for c in schema.columns}
    pk = schema.primary_key

    def refused(reason: str, message: str, at: int = -1) -> Plan:
        return Plan(RequestInvalid(reason, message), None, at, False, None, -1)

    unknown = [n for n in names if n not in types]
    if unknown:
        return refused(Reason.UNKNOWN_COLUMN, f"{_WHERE} has no column(s) {', '.join(unknown)}")
    if pk not in names:
        return refused(
            Reason.MISSING_PRIMARY_KEY, f"rows for {_WHERE} lack primary key column {pk!r}"
        )
    fields = []
    for name in names:
        got = have.field(name).type
        want = _ARROW.get(types[name])
        if want is None:  # e.g. timestamp: the engine decides
            fields.append(pa.field(name, got))
            continue
        if not _fits(got, want):
            return refused(
                Reason.TYPE_MISMATCH,
                f"column {_WHERE}.{name} is {types[name]}, got {got}",
                names.index(pk),
            )
        fields.append(pa.field(name, want))
    target = pa.schema(fields)
    wanted = [c.name for c in schema.columns]
    complete = len(names) == len(wanted) and sorted(names) == sorted(wanted)
    return Plan(
        None,
        None if target == have else target,
        names.index(pk),
        complete,
        None if names == wanted else wanted,
        wanted.index(pk),
    )


def conform_rows(engine: Any, op: TxnOp) -> tuple[pa.Table, TableSchema | None]:
    """Check `op.rows` against the table's committed schema and cast to it.

    When the table is not in the committed catalog (e.g. created earlier in the
    same request), the rows go to the engine unchanged and it judges them
    (the schema returned is then None).
    """
    rows, schema, _ = conform(engine, op)
    return rows, schema


def conform(engine: Any, op: TxnOp) -> tuple[pa.Table, TableSchema | None, Plan | None]:
    """`conform_rows`, and the `Plan` it followed (None with the schema)."""
    rows = op.rows
    if rows is None:
        raise RequestInvalid(
            Reason.INVALID_REQUEST, f"{op.kind.value} on {op.database}.{op.table} without rows"
        )
    try:
        schema = engine.schema(op.database, op.table)
    except TnError:
        return rows, None, None
    plan = _plan(schema, rows.schema)
    where = f"{op.database}.{op.table}"
    if plan.error is not None and plan.pk < 0:  # checked before the key's nulls
        raise RequestInvalid(plan.error.reason, plan.error.message.replace(_WHERE, where))
    if rows.column(plan.pk).null_count:
        raise RequestInvalid(
            Reason.MISSING_PRIMARY_KEY,
            f"rows for {where} have a null primary key {schema.primary_key!r}",
        )
    if plan.error is not None:
        raise RequestInvalid(plan.error.reason, plan.error.message.replace(_WHERE, where))
    if plan.target is None:
        return rows, schema, plan
    try:
        return rows.cast(plan.target, safe=True), schema, plan
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise RequestInvalid(Reason.TYPE_MISMATCH, f"rows for {where}: {e}") from e


def apply_ops(engine: Any, txn: Any, req: TxnRequest, store: ObjectStore | None = None) -> None:
    """Apply every op of `req` to the open engine transaction `txn`. INSERTs whose rows
    are in object storage (a large transaction) need `store`; see `_attach`."""
    if not req.ops:
        raise RequestInvalid(Reason.INVALID_REQUEST, "request has no operations")
    large = {(op.database, op.table) for op in req.ops if op.objects}
    if large:
        _attach(engine, txn, req, large, store)
    for op in req.ops:
        if op.objects:
            continue
        if op.kind in (OpKind.INSERT, OpKind.UPDATE, OpKind.DELETE) and (
            (op.database, op.table) in large
        ):
            raise RequestInvalid(
                Reason.INVALID_REQUEST,
                f"{op.kind.value} on {op.database}.{op.table}, which the same transaction "
                "inserts into from objects (a large transaction's table takes only those)",
            )
        k = op.kind
        needs_table = k not in (OpKind.CREATE_DATABASE, OpKind.DROP_DATABASE)
        if not op.database or (needs_table and not op.table):
            raise RequestInvalid(
                Reason.INVALID_REQUEST, f"{k.value} needs a database and table name"
            )
        if k is OpKind.CREATE_DATABASE:
            txn.create_database(op.database)
        elif k is OpKind.DROP_DATABASE:
            txn.drop_database(op.database)
        elif k is OpKind.CREATE_TABLE:
            if not op.columns:
                raise RequestInvalid(Reason.INVALID_REQUEST, "create table without columns")
            if op.primary_key not in {c.name for c in op.columns}:
                raise RequestInvalid(
                    Reason.MISSING_PRIMARY_KEY,
                    f"primary key {op.primary_key!r} is not one of the columns of {op.database}.{op.table}",
                )
            txn.create_table(
                op.database, op.table, [(c.name, c.type) for c in op.columns], op.primary_key
            )
        elif k is OpKind.DROP_TABLE:
            txn.drop_table(op.database, op.table)
        elif k is OpKind.ADD_COLUMN:
            if len(op.columns) != 1:
                raise RequestInvalid(Reason.INVALID_REQUEST, "add column needs exactly one column")
            txn.add_column(op.database, op.table, op.columns[0].name, op.columns[0].type)
        elif k is OpKind.DROP_COLUMN:
            if len(op.columns) != 1:
                raise RequestInvalid(Reason.INVALID_REQUEST, "drop column needs exactly one column")
            txn.drop_column(op.database, op.table, op.columns[0].name)
        elif k is OpKind.INSERT:
            txn.insert(op.database, op.table, conform_rows(engine, op)[0])
        elif k is OpKind.UPDATE:
            txn.update(op.database, op.table, conform_rows(engine, op)[0])
        elif k is OpKind.DELETE:
            if op.keys is None:
                raise RequestInvalid(Reason.INVALID_REQUEST, "delete without keys")
            txn.delete(op.database, op.table, list(op.keys))
        else:  # pragma: no cover - the enum is closed
            raise RequestInvalid(Reason.INVALID_REQUEST, f"unknown op {k}")


def _attach(
    engine: Any,
    txn: Any,
    req: TxnRequest,
    tables: set[tuple[str, str]],
    store: ObjectStore | None,
) -> None:
    """A large transaction's objects (docs/large-transactions.md): each is validated
    against its table's committed schema and laid out as block objects now; the blocks
    join `txn` as one system op, so they commit with the request's other ops, in the same
    WAL entry (object references only), or not at all."""
    if store is None:
        raise RequestInvalid(
            Reason.INVALID_REQUEST, "this TN has no object store for a large transaction"
        )
    start = txn.start_ts
    plans = []
    try:
        for op in req.ops:
            if not op.objects:
                continue
            if op.kind is not OpKind.INSERT or op.rows is not None:
                raise RequestInvalid(
                    Reason.INVALID_REQUEST,
                    f"{op.kind.value} on {op.database}.{op.table}: only an INSERT without "
                    "inline rows may name objects",
                )
            if not op.database or not op.table:
                raise RequestInvalid(Reason.INVALID_REQUEST, "INSERT needs a database and table name")
            t, schema = committed_table(engine, op.database, op.table)
            for key in op.objects:
                plans.append(prepare_object(engine, store, t, schema, key, start))
        add_objects(engine, txn, plans, start)
    except LargeTxnError as e:
        raise RequestInvalid(e.code, e.message) from e


def result_for_error(request_id: str, e: BaseException, **kw: Any) -> TxnResult:
    """The aborted result an exception from validation, the engine or the commit maps to."""
    if isinstance(e, RequestInvalid):
        return TxnResult.aborted(request_id, Kind.VALIDATION, e.reason, e.message, **kw)
    if isinstance(e, ConflictError):
        return TxnResult.aborted(request_id, Kind.CONFLICT, _code(e, Reason.CONFLICT), str(e), **kw)
    if isinstance(e, EngineValidationError):
        return TxnResult.aborted(
            request_id, Kind.VALIDATION, _code(e, Reason.VALIDATION), str(e), **kw
        )
    if isinstance(e, EngineClosedError):
        return TxnResult.aborted(request_id, Kind.INTERNAL, Reason.SHUTTING_DOWN, str(e), **kw)
    if isinstance(e, TnError):
        return TxnResult.aborted(request_id, Kind.INTERNAL, _code(e, Reason.INTERNAL), str(e), **kw)
    return TxnResult.aborted(
        request_id, Kind.INTERNAL, Reason.INTERNAL, f"{type(e).__name__}: {e}", **kw
    )


def _code(e: BaseException, default: str) -> str:
    code = getattr(e, "code", "")
    return code if isinstance(code, str) and code else default
