"""A poll's worth of requests run as groups; results leave per group and client.

Each test stops the service, sends its requests, and starts a new service on the same
engine: the new service's first poll takes every request at once, so they meet the
grouping together (not as luck of timing would have it).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from infra.config import KwalConfig
from producers import Client, CommitResult, ConflictError, ValidationError
from schemas.codec import schema_of
from schemas.requests import (
    RESULT_BATCH_SCHEMA,
    RESULT_SCHEMA,
    OpKind,
    Reason,
    TxnOp,
    TxnRequest,
    decode_results,
    encode_request,
)
from tests.service.conftest import RunningTn
from tests.service.test_service import T, rows_of, setup_table
from tn.service.service import TnService

Record = tuple[bytes | None, str, list[str]]  # key, schema name, request ids


def _records(cfg: KwalConfig, want_results: int, timeout: float = 60.0) -> list[Record]:
    """The results topic's records until `want_results` results were read (bounded)."""
    import time

    c = Consumer(cfg.kafka_client(**{"group.id": "t-grouping", "fetch.wait.max.ms": 50}))
    c.assign([TopicPartition(cfg.topics.results, 0, 0)])
    out: list[Record] = []
    deadline = time.monotonic() + timeout
    try:
        while sum(len(r[2]) for r in out) < want_results and time.monotonic() < deadline:
            for m in c.consume(100, timeout=0.2):
                if m.error() is None:
                    value = m.value() or b""
                    ids = [r.request_id for r in decode_results(value)]
                    out.append((m.key(), schema_of(value), ids))
    finally:
        c.close()
    return out


def _paused(tn: RunningTn, send: Callable[[], None]) -> None:
    """Stop the service, `send`, start a new one: its first poll takes everything sent."""
    tn.service.stop()
    send()
    tn.service = TnService(tn.cfg, tn.engine)
    tn.service.start()


def _rows(ids: list[int], name: str) -> pa.Table:
    return pa.table({"id": ids, "name": [name] * len(ids), "price": [1.0] * len(ids)})


def test_one_poll_with_a_conflict_a_duplicate_key_and_a_bad_request(
    tn: RunningTn, client_factory: Callable[..., Client], kwal_config: KwalConfig
) -> None:
    client = client_factory()
    setup_table(client)
    futs: list[Future[CommitResult]] = []
    rids: list[str] = []

    def send() -> None:
        for table, rows in (
            (T, _rows([1], "first")),  # 0: grouped with 1
            (T, _rows([2], "b")),  # 1
            (T, _rows([1], "second")),  # 2: key 1 again -- loses to 0
            (T, _rows([7, 7], "twice")),  # 3: a key twice in one request
            (T, pa.table({"id": [8], "colour": ["red"]})),  # 4: no such column
            (T, _rows([3], "c")),  # 5: grouped with 6
            (T, _rows([4], "d")),  # 6
        ):
            txn = client.begin().insert(table, rows)
            rids.append(txn.request_id)
            futs.append(txn.commit_async())
        client.flush(10)

    _paused(tn, send)
    ok = {i: futs[i].result(timeout=60) for i in (0, 1, 5, 6)}
    # The later writer of key 1 loses, by one of two verdicts: the group of 0 and 1 is
    # committing (a pipeline future) while 2 runs on its own after it, so 2 either began
    # before that commit landed (a write-write conflict at its commit) or after (its
    # insert meets a committed key). Which one is timing, not semantics.
    with pytest.raises((ConflictError, ValidationError)) as later:
        futs[2].result(timeout=60)
    assert isinstance(later.value, ConflictError) or later.value.code == "duplicate_key"
    with pytest.raises(ValidationError) as twice:
        futs[3].result(timeout=60)
    assert twice.value.code == "duplicate_key"
    with pytest.raises(ValidationError) as bad:
        futs[4].result(timeout=60)
    assert bad.value.code == Reason.UNKNOWN_COLUMN  # checked by the TN, not the engine
    # grouped members share their group's commit ts; the groups are in request order
    assert ok[0].commit_ts == ok[1].commit_ts < ok[5].commit_ts == ok[6].commit_ts
    got = rows_of(tn)
    assert sorted(got) == [1, 2, 3, 4] and got[1]["name"] == "first"
    # every request is answered exactly once, several in one record to this client
    records = _records(kwal_config, want_results=len(rids) + 1)
    counts = Counter(rid for _, _, ids in records for rid in ids)
    assert all(counts[rid] == 1 for rid in rids), counts
    batches = [ids for key, schema, ids in records if schema == RESULT_BATCH_SCHEMA]
    # a group's results leave together (with whatever else of this client was ready)
    assert any({rids[0], rids[1]} <= set(ids) for ids in batches), batches
    assert any({rids[5], rids[6]} <= set(ids) for ids in batches), batches
    batch_keys = {key for key, schema, _ in records if schema == RESULT_BATCH_SCHEMA}
    assert batch_keys == {client.client_id.encode()}


def test_a_request_without_the_batch_header_gets_one_result_record_per_request(
    tn: RunningTn, client: Client, kwal_config: KwalConfig
) -> None:
    """The older request form (no `kwal-results` header, as every earlier client sends):
    one `txn_result` record per request, keyed by its request id, even in a group."""
    setup_table(client)
    rids = [uuid.uuid4().hex for _ in range(4)]

    def send() -> None:
        p = Producer(kwal_config.kafka_client())
        for i, rid in enumerate(rids):
            req = TxnRequest(
                rid, "old", (TxnOp(OpKind.INSERT, "shop", "items", rows=_rows([50 + i], "o")),)
            )
            p.produce(kwal_config.topics.requests, key=b"old", value=encode_request(req))
        p.flush(10)

    _paused(tn, send)
    records = _records(kwal_config, want_results=len(rids) + 1)
    mine = [(key, schema, ids) for key, schema, ids in records if set(ids) & set(rids)]
    assert sorted(ids[0] for _, _, ids in mine) == sorted(rids)
    assert all(
        schema == RESULT_SCHEMA and key == ids[0].encode() and len(ids) == 1
        for key, schema, ids in mine
    )
    assert sorted(rows_of(tn)) == [50, 51, 52, 53]


def test_big_inserts_group_by_their_key_arrays() -> None:
    """Requests of COLUMNAR_MIN rows or more carry their keys as sorted int64 arrays
    (no tuple per row): overlaps with other big or small members are still found, and a
    key twice in one request still makes it run alone. No broker: the engine's own."""
    from tests.tn.helpers import new_engine
    from tests.tn.helpers import setup_table as engine_table
    from tn.service.grouping import Group, member_of
    from tn.txn.rows import COLUMNAR_MIN

    e, _ = new_engine()
    engine_table(e)
    n = COLUMNAR_MIN

    def member(ids: list[int]):  # type: ignore[no-untyped-def]
        rows = pa.table({"id": pa.array(ids, pa.int64()), "v": [str(i) for i in ids]})
        op = TxnOp(OpKind.INSERT, "db", "t", rows=rows)
        return member_of(e, TxnRequest(uuid.uuid4().hex, "c", (op,)), 0)

    a, b = member(list(range(n))), member(list(range(2 * n - 1, n - 1, -1)))
    assert a is not None and b is not None and b.big[("db", "t")][0] == n
    g = Group()
    assert g.fits(a, 64)
    g.add(a)
    assert g.fits(b, 64)
    g.add(b)
    for clash in (list(range(2 * n - 1, 3 * n)), [5], [2 * n, n + 3]):
        m = member(clash)
        assert m is not None and not g.fits(m, 64), clash
    assert g.fits(member([3 * n]), 64)
    assert member(list(range(n)) + [7]) is None  # a key twice: the engine says so alone
    assert len(g.take()) == 2 and not g.big and g.fits(member(list(range(n))), 64)


def test_a_groups_tables_of_one_table_are_joined_per_schema_in_order() -> None:
    """`_flush` concatenates a table's member rows per schema (`concat_tables` takes one):
    runs in order of each schema's first table, every table in its schema's run."""
    from tn.service.service import _by_schema

    a1 = pa.table({"id": pa.array([1], pa.int64()), "v": pa.array([1], pa.int64())})
    a2 = pa.table({"id": pa.array([2], pa.int64()), "v": pa.array([2], pa.int64())})
    b1 = pa.table({"id": pa.array([3], pa.int64()), "v": pa.array(["x"])})
    c1 = pa.table({"v": pa.array([4], pa.int64()), "id": pa.array([4], pa.int64())})
    assert _by_schema([a1, a2]) == [[a1, a2]]
    runs = _by_schema([a1, b1, a2, c1, b1])
    assert [[t.column("id").to_pylist()[0] for t in run] for run in runs] == [[1, 2], [3, 3], [4]]
    for run in runs:
        pa.concat_tables(run)  # one schema each
