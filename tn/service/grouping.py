"""Grouping: many requests, one engine transaction.

Requests that are only INSERTs into tables of the committed catalog, with
primary keys distinct from each other's, are grouped (up to `group_max`, in
consumption order, never across a request of another kind) and run as ONE
engine transaction: their system-table rows go in the same transaction, so
exactly-once holds per request; they share one commit ts. If the grouped
transaction fails (a conflict, a duplicate key, a type the engine refuses),
nothing of it is visible and each member runs again on its own and gets its
own verdict. For blind writes on distinct keys this is the outcome of
committing them one after the other; a member that conflicts with a
transaction outside the group is simply re-run after it (it never read
anything). `group_max=1` turns grouping off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from schemas.requests import OpKind, TxnRequest
from tn.service.apply import conform_rows


@dataclass
class Member:
    req: TxnRequest
    offset: int
    inserts: list[tuple[str, str, pa.Table]]
    keys: set[tuple[str, str, Any]]


class Group:
    """Independent INSERT-only requests (pairwise distinct keys) run as ONE engine
    transaction: they commit atomically at one commit ts, or, if that
    transaction fails, each runs again on its own. For blind writes on distinct
    keys this is the same outcome as committing them one after the other."""

    def __init__(self) -> None:
        self.members: list[Member] = []
        self.keys: set[tuple[str, str, Any]] = set()

    def fits(self, m: Member, limit: int) -> bool:
        return len(self.members) < limit and self.keys.isdisjoint(m.keys)

    def add(self, m: Member) -> None:
        self.members.append(m)
        self.keys |= m.keys

    def take(self) -> list[Member]:
        members, self.members, self.keys = self.members, [], set()
        return members


def member_of(engine: Any, req: TxnRequest, offset: int) -> Member | None:
    """The request as a group member, or None if it must run on its own: only
    requests made of INSERTs into tables of the committed catalog, with
    distinct primary keys, are grouped."""
    inserts: list[tuple[str, str, pa.Table]] = []
    keys: set[tuple[str, str, Any]] = set()
    for op in req.ops:
        if op.kind is not OpKind.INSERT or op.objects:
            return None
        rows, schema = conform_rows(engine, op)  # RequestInvalid -> aborted by caller
        if schema is None:
            return None  # not a committed table: the engine judges it alone
        names = [c.name for c in schema.columns]
        if sorted(rows.column_names) != sorted(names):
            return None
        rows = rows.select(names)
        op_keys = rows.column(schema.primary_key).to_pylist()
        before = len(keys)
        keys.update((op.database, op.table, k) for k in op_keys)
        if len(keys) != before + len(op_keys):
            return None  # a key twice in one request: let the engine say so
        inserts.append((op.database, op.table, rows))
    if not inserts:
        return None
    return Member(req, offset, inserts, keys)
