"""Randomized differential test: random interleaved transactions against the engine and
against a simple model of the same semantics (snapshot isolation, first committer wins on
primary keys, DDL conflicts); the committed state must be equal at every commit ts."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.tn.helpers import new_engine
from tn.engine import Engine
from tn.exceptions import TnError
from tn.txn.transaction import Transaction

TABLES = ("a", "b", "c")
KEYS = 12


@dataclass
class MTxn:
    start: int
    view: dict[str, int]  # table name -> incarnation, as this txn sees it
    rows: dict[int, dict[int, str]]  # incarnation -> rows as this txn sees them
    created: set[int] = field(default_factory=set)
    ops: list[tuple[str, str, int]] = field(default_factory=list)
    wkeys: set[tuple[int, int]] = field(default_factory=set)
    dml: set[int] = field(default_factory=set)
    own_live: set[tuple[int, int]] = field(default_factory=set)
    own_dead: set[tuple[int, int]] = field(default_factory=set)


class Model:
    def __init__(self) -> None:
        self.tables: dict[str, int] = {}
        self.rows: dict[int, dict[int, str]] = {}
        self.name_ts: dict[str, int] = {}
        self.dropped: dict[int, int] = {}
        self.key_ts: dict[tuple[int, int], int] = {}
        self.history: list[tuple[int, dict[str, tuple[int, dict[int, str]]]]] = []
        self._inc = 0

    def new_inc(self) -> int:
        self._inc += 1
        return self._inc

    def snapshot(self, ts: int) -> tuple[dict[str, int], dict[int, dict[int, str]]]:
        for cts, tables in reversed(self.history):
            if cts <= ts:
                return self._split(tables)
        return {}, {}

    def _split(self, tables: dict[str, Any]) -> tuple[dict[str, int], dict[int, dict[int, str]]]:
        view = {name: inc for name, (inc, _) in tables.items()}
        rows = {inc: dict(r) for inc, r in tables.values()}
        return view, rows

    def begin(self, start: int) -> MTxn:
        view, rows = self.snapshot(start)
        return MTxn(start, view, rows)

    def insert(self, t: MTxn, name: str, data: dict[int, str]) -> str | None:
        if name not in t.view:
            return "unknown_table"
        inc = t.view[name]
        for k in data:
            key = (inc, k)
            if key in t.own_live:
                return "duplicate_key"
            if key in t.own_dead or self.key_ts.get(key, 0) > t.start:
                continue
            if k in t.rows[inc]:
                return "duplicate_key"
        for k, v in data.items():
            t.rows[inc][k] = v
            t.own_live.add((inc, k))
            t.own_dead.discard((inc, k))
            t.wkeys.add((inc, k))
        t.dml.add(inc)
        return None

    def delete(self, t: MTxn, name: str, keys: list[int]) -> str | None:
        if name not in t.view:
            return "unknown_table"
        inc = t.view[name]
        for k in keys:
            key = (inc, k)
            if key in t.own_live:
                t.own_live.discard(key)
            elif key in t.own_dead:
                continue
            elif self.key_ts.get(key, 0) > t.start:
                t.wkeys.add(key)
                t.dml.add(inc)
                continue
            elif k not in t.rows[inc]:
                continue
            t.rows[inc].pop(k, None)
            t.own_dead.add(key)
            t.wkeys.add(key)
            t.dml.add(inc)
        return None

    def update(self, t: MTxn, name: str, data: dict[int, str]) -> str | None:
        err = self.delete(t, name, list(data))
        return err or self.insert(t, name, data)

    def create(self, t: MTxn, name: str) -> str | None:
        if name in t.view:
            return "exists"
        inc = self.new_inc()
        t.view[name] = inc
        t.rows[inc] = {}
        t.created.add(inc)
        t.ops.append(("create", name, inc))
        return None

    def drop(self, t: MTxn, name: str) -> str | None:
        if name not in t.view:
            return "unknown_table"
        inc = t.view.pop(name)
        t.ops.append(("drop", name, inc))
        return None

    def check(self, t: MTxn) -> str | None:
        if not (t.ops or t.wkeys):
            return None
        for kind, name, inc in t.ops:
            if kind == "create" and self.name_ts.get(name, 0) > t.start:
                return "ddl_conflict"
            if kind == "drop" and inc not in t.created and inc in self.dropped:
                return "ddl_conflict"
        for inc in t.dml:
            if inc not in t.created and inc in self.dropped:
                return "ddl_conflict"
        for key in t.wkeys:
            if self.key_ts.get(key, 0) > t.start:
                return "write_conflict"
        return None

    def commit(self, t: MTxn, cts: int) -> None:
        if not (t.ops or t.wkeys):
            return
        for kind, name, inc in t.ops:
            self.name_ts[name] = cts
            if kind == "create":
                self.tables[name] = inc
                self.rows[inc] = {}
            else:
                self.tables.pop(name, None)
                self.dropped[inc] = cts
        for inc, k in t.wkeys:
            self.key_ts[(inc, k)] = cts
            if k in t.rows[inc]:
                self.rows[inc][k] = t.rows[inc][k]
            else:
                self.rows[inc].pop(k, None)
        state = {name: (inc, dict(self.rows[inc])) for name, inc in self.tables.items()}
        self.history.append((cts, state))


def _code(fn: Any, *args: Any) -> str | None:
    try:
        fn(*args)
    except TnError as e:
        return e.code
    return None


def run(seed: int, steps: int) -> tuple[Engine, Model]:
    rng = random.Random(seed)
    e, _ = new_engine()
    model = Model()
    txn = e.begin()
    txn.create_database("db")
    txn.create_table("db", "a", [("id", "int64"), ("v", "string")], "id")
    mt = model.begin(0)
    model.create(mt, "a")
    ts = txn.commit().result(timeout=10)
    model.commit(mt, ts)
    open_: list[tuple[Transaction, MTxn]] = []
    for step in range(steps):
        r = rng.random()
        if not open_ or (r < 0.15 and len(open_) < 4):
            txn = e.begin()
            open_.append((txn, model.begin(txn.start_ts)))
            continue
        i = rng.randrange(len(open_))
        txn, mt = open_[i]
        r = rng.random()
        name = rng.choice(TABLES)
        if r < 0.35:
            data = {k: f"{seed}.{step}.{k}" for k in rng.sample(range(KEYS), rng.randint(1, 3))}
            rows = [{"id": k, "v": v} for k, v in data.items()]
            got = _code(txn.insert, "db", name, rows)
            want = model.insert(mt, name, data)
        elif r < 0.5:
            keys = rng.sample(range(KEYS), rng.randint(1, 3))
            got = _code(txn.delete, "db", name, keys)
            want = model.delete(mt, name, keys)
        elif r < 0.62:
            data = {k: f"u{seed}.{step}.{k}" for k in rng.sample(range(KEYS), rng.randint(1, 2))}
            rows = [{"id": k, "v": v} for k, v in data.items()]
            got = _code(txn.update, "db", name, rows)
            want = model.update(mt, name, data)
        elif r < 0.66:
            got = _code(txn.create_table, "db", name, [("id", "int64"), ("v", "string")], "id")
            want = model.create(mt, name)
        elif r < 0.69:
            got = _code(txn.drop_table, "db", name)
            want = model.drop(mt, name)
        elif r < 0.93:
            open_.pop(i)
            want = model.check(mt)
            try:
                cts = txn.commit().result(timeout=10)
                got = None
            except TnError as err:
                got = err.code
            assert got == want, (seed, step, "commit", got, want)
            if got is None:
                model.commit(mt, cts)
            continue
        else:
            open_.pop(i)
            txn.rollback()
            continue
        assert got == want, (seed, step, r, name, got, want)
    for txn, _ in open_:
        txn.rollback()
    return e, model


@pytest.mark.parametrize("seed", range(6))
def test_random_transactions_match_model(seed: int) -> None:
    e, model = run(seed, 600)
    assert len(model.history) > 30
    checked = 0
    for cts, _state in model.history:
        for ts in (cts, cts - 1) if checked % 3 == 0 else (cts,):
            view, rows = model.snapshot(ts)
            assert e.tables(ts) == (
                {"db": sorted(view)} if view or ts >= model.history[0][0] else {}
            )
            for name, inc in view.items():
                got = {r["id"]: r["v"] for r in e.read("db", name, ts).to_pylist()}
                assert got == rows[inc], (seed, ts, name)
        checked += 1
