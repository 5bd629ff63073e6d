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

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from schemas.requests import OpKind, TxnRequest
from tn.service.apply import conform
from tn.txn.rows import COLUMNAR_MIN

Table = tuple[str, str]  # (database, table)
_INT64 = pa.int64()


@dataclass
class Member:
    req: TxnRequest
    offset: int
    inserts: list[tuple[str, str, pa.Table]]
    keys: set[tuple[str, str, Any]]
    # the int64 keys of big inserts (`COLUMNAR_MIN` rows or more) per table, sorted and
    # unique: checked with numpy, not as a Python tuple per row
    big: dict[Table, np.ndarray] = field(default_factory=dict)


class Group:
    """Independent INSERT-only requests (pairwise distinct keys) run as ONE engine
    transaction: they commit atomically at one commit ts, or, if that
    transaction fails, each runs again on its own. For blind writes on distinct
    keys this is the same outcome as committing them one after the other."""

    def __init__(self) -> None:
        self.members: list[Member] = []
        self.keys: set[tuple[str, str, Any]] = set()
        self.big: dict[Table, list[np.ndarray]] = {}

    def fits(self, m: Member, limit: int) -> bool:
        if len(self.members) >= limit or not self.keys.isdisjoint(m.keys):
            return False
        return not (m.big or self.big) or self._big_disjoint(m)

    def _big_disjoint(self, m: Member) -> bool:
        """No key of `m` is in the group, where either side holds big inserts' arrays."""
        for t, arr in m.big.items():
            if any(_overlap(arr, g) for g in self.big.get(t, ())):
                return False
            small = _small_keys(self.keys, t)
            if small is not None and np.isin(small, arr).any():
                return False
        for t, arrays in self.big.items():
            small = _small_keys(m.keys, t)
            if small is not None and any(np.isin(small, a).any() for a in arrays):
                return False
        return True

    def add(self, m: Member) -> None:
        self.members.append(m)
        self.keys |= m.keys
        for t, arr in m.big.items():
            self.big.setdefault(t, []).append(arr)

    def take(self) -> list[Member]:
        members, self.members, self.keys, self.big = self.members, [], set(), {}
        return members


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two sorted unique key arrays share a key (disjoint ranges: no numpy work)."""
    if a[-1] < b[0] or b[-1] < a[0]:
        return False
    return bool(np.intersect1d(a, b, assume_unique=True).size)


def _small_keys(keys: set[tuple[str, str, Any]], t: Table) -> np.ndarray | None:
    """The keys of table `t` in a set of (database, table, key), as int64 (None: none)."""
    if not keys:
        return None
    mine = [k for d, tb, k in keys if (d, tb) == t]
    return np.array(mine, dtype=np.int64) if mine else None


def member_of(engine: Any, req: TxnRequest, offset: int) -> Member | None:
    """The request as a group member, or None if it must run on its own: only
    requests made of INSERTs into tables of the committed catalog, with
    distinct primary keys, are grouped."""
    inserts: list[tuple[str, str, pa.Table]] = []
    keys: set[tuple[str, str, Any]] = set()
    big: dict[Table, np.ndarray] = {}
    for op in req.ops:
        if op.kind is not OpKind.INSERT or op.objects:
            return None
        rows, schema, plan = conform(engine, op)  # RequestInvalid -> aborted by caller
        if schema is None or plan is None:
            return None  # not a committed table: the engine judges it alone
        if not plan.complete:
            return None
        if plan.order is not None:
            rows = rows.select(plan.order)
        t = (op.database, op.table)
        pk = rows.column(plan.pk_at)
        if len(pk) >= COLUMNAR_MIN and pk.type == _INT64:
            # a big insert: its keys as one sorted array (no Python object per row)
            arr = pk.to_numpy()
            if not bool((arr[1:] > arr[:-1]).all()):
                arr = np.sort(arr)
                if bool((arr[1:] == arr[:-1]).any()):
                    return None  # a key twice in one request: let the engine say so
            had = big.get(t)
            if had is not None:
                if _overlap(had, arr):
                    return None
                arr = np.sort(np.concatenate((had, arr)))
            big[t] = arr
        else:
            op_keys = pk.to_pylist()
            before = len(keys)
            keys.update((op.database, op.table, k) for k in op_keys)
            if len(keys) != before + len(op_keys):
                return None  # a key twice in one request: let the engine say so
        inserts.append((op.database, op.table, rows))
    if not inserts:
        return None
    if big and any(_small_keys(keys, t) is not None for t in big):
        return None  # small and big inserts into one table: the engine checks it alone
    return Member(req, offset, inserts, keys, big)
