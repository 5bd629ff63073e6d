"""The TN service and the producers client against a real broker."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

import producers.client as client_module
import tn.service.service as service_module
from infra.config import KwalConfig
from infra.topics import ensure_topics
from producers import Client, CommitResult, ConflictError, ValidationError
from schemas.requests import (
    OpKind,
    TxnOp,
    TxnRequest,
    TxnResult,
    decode_results,
    encode_request,
)
from tests.delivery import NoOffset
from tests.service.conftest import RunningTn, SlowDriver
from tests.stalled_reader import StalledReader
from tn.engine import Engine
from tn.logstore.driver import LogStore

T = "shop.items"


def setup_table(client: Client) -> CommitResult:
    txn = client.begin()
    txn.create_database("shop")
    txn.create_table(T, [("id", "int64"), ("name", "string"), ("price", "float64")], "id")
    return txn.commit(timeout=30)


def rows_of(tn: RunningTn, table: str = T, ts: int | None = None) -> dict[Any, dict[str, Any]]:
    db, name = table.split(".")
    return {r["id"]: r for r in tn.engine.read(db, name, ts).to_pylist()}


def raw_results(
    cfg: KwalConfig, want: int, timeout: float = 20.0
) -> list[tuple[bytes | None, TxnResult]]:
    """Every result on the results topic (until `want` of them or the timeout)."""
    c = Consumer(cfg.kafka_client(**{"group.id": "t-raw", "fetch.wait.max.ms": 50}))
    c.assign([TopicPartition(cfg.topics.results, 0, 0)])
    out: list[tuple[bytes | None, TxnResult]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < want and time.monotonic() < deadline:
            for m in c.consume(100, timeout=0.2):
                if m.error() is None:
                    # one result, or a batch of one client's (a `Client` asks for them)
                    out.extend((m.key(), r) for r in decode_results(m.value() or b""))
    finally:
        c.close()
    return out


def test_round_trip_ddl_insert_read(tn: RunningTn, client: Client) -> None:
    created = setup_table(client)
    assert created.commit_ts > 0

    txn = client.begin()
    txn.insert(T, [{"id": 1, "name": "apple", "price": 1.5}, {"id": 2, "name": "pear", "price": 2}])
    txn.insert(T, [[3, "plum", 0.5]], columns=["id", "name", "price"])
    txn.insert(T, pa.table({"id": [4], "name": ["fig"], "price": [3.25]}))
    r1 = txn.commit(timeout=30)
    assert r1.commit_ts > created.commit_ts
    assert r1.request_id == txn.request_id

    got = rows_of(tn)
    assert sorted(got) == [1, 2, 3, 4]
    assert got[2]["price"] == 2.0 and got[3]["name"] == "plum"

    txn = client.begin()
    txn.delete(T, [1])
    txn.update(T, [{"id": 2, "name": "pear", "price": 9.0}])
    r2 = txn.commit(timeout=30)
    now = rows_of(tn)
    assert sorted(now) == [2, 3, 4] and now[2]["price"] == 9.0
    # snapshot read at the earlier commit still sees the old state
    assert sorted(rows_of(tn, ts=r1.commit_ts)) == [1, 2, 3, 4]
    assert r2.commit_ts > r1.commit_ts

    # DDL + DML in one transaction, async
    txn = client.begin()
    txn.create_table("shop.tags", [("id", "int64"), ("tag", "string")], "id")
    txn.insert("shop.tags", [{"id": 1, "tag": "x"}])
    res = txn.commit_async().result(timeout=30)
    assert res.commit_ts > r2.commit_ts
    assert rows_of(tn, "shop.tags")[1]["tag"] == "x"


def test_conflict_aborts_exactly_one(tn: RunningTn, client: Client) -> None:
    setup_table(client)
    seed = client.begin()
    seed.insert(T, [{"id": i, "name": "v0", "price": 0.0} for i in range(10)])
    seed.commit(timeout=30)

    conflicts = 0
    for i in range(10):
        a, b = client.begin(), client.begin()
        a.update(T, [{"id": i, "name": "a", "price": 1.0}])
        b.update(T, [{"id": i, "name": "b", "price": 2.0}])
        fa, fb = a.commit_async(), b.commit_async()
        outcomes: list[CommitResult | ConflictError] = []
        for f in (fa, fb):
            try:
                outcomes.append(f.result(timeout=30))
            except ConflictError as e:
                assert e.code == "write_conflict"
                outcomes.append(e)
        committed = [o for o in outcomes if isinstance(o, CommitResult)]
        if len(committed) == 1:
            conflicts += 1
            winner = "a" if isinstance(outcomes[0], CommitResult) else "b"
            assert rows_of(tn)[i]["name"] == winner
        else:  # both ran one after the other: no overlap, no conflict
            assert len(committed) == 2
    assert conflicts >= 1, "no pair of concurrent updates overlapped"


def test_validation_errors_get_codes_and_tn_stays_up(
    tn: RunningTn, client: Client, kwal_config: KwalConfig
) -> None:
    setup_table(client)
    kwal_config.tn.max_request_bytes = 50_000  # the running TN reads this config object
    cases: list[tuple[str, Any]] = [
        ("unknown_table", lambda t: t.insert("shop.nope", [{"id": 1}])),
        ("unknown_database", lambda t: t.insert("nodb.items", [{"id": 1}])),
        ("type_mismatch", lambda t: t.insert(T, [{"id": 1, "name": 5, "price": 1.0}])),
        ("type_mismatch", lambda t: t.insert(T, [{"id": "one", "name": "x", "price": 1.0}])),
        ("missing_primary_key", lambda t: t.insert(T, [{"name": "x", "price": 1.0}])),
        ("missing_primary_key", lambda t: t.insert(T, [{"id": None, "name": "x", "price": 1.0}])),
        ("bad_column", lambda t: t.insert(T, [{"id": 1, "colour": "red"}])),
        ("oversized", lambda t: t.insert(T, [{"id": 1, "name": "x" * 100_000, "price": 1.0}])),
    ]
    for code, build in cases:
        txn = client.begin()
        build(txn)
        with pytest.raises(ValidationError) as info:
            txn.commit(timeout=30)
        if code == "unknown_database":
            assert info.value.code in ("unknown_database", "unknown_table"), info.value
        else:
            assert info.value.code == code, info.value
        assert info.value.message
    # nothing changed, and the TN still commits
    assert rows_of(tn) == {}
    ok = client.begin().insert(T, [{"id": 7, "name": "ok", "price": 1.0}]).commit(timeout=30)
    assert ok.commit_ts > 0 and sorted(rows_of(tn)) == [7]
    assert tn.service.healthy()


def test_undecodable_requests_get_results(
    tn: RunningTn, client: Client, kwal_config: KwalConfig
) -> None:
    setup_table(client)
    p = Producer(kwal_config.kafka_client())
    good_id = uuid.uuid4().hex
    good = encode_request(
        TxnRequest(
            good_id, "raw", (TxnOp(OpKind.INSERT, "shop", "items", rows=pa.table({"id": [1]})),)
        )
    )
    bad_id = uuid.uuid4().hex
    truncated = encode_request(
        TxnRequest(
            bad_id, "raw", (TxnOp(OpKind.INSERT, "shop", "items", rows=pa.table({"id": [1]})),)
        )
    )[:60]
    newer = b"KW\x07" + good[3:]  # an envelope version this reader does not know
    for value in (b"garbage", newer, truncated):
        p.produce(kwal_config.topics.requests, key=b"evil", value=value)
    p.flush(10)
    results = raw_results(kwal_config, want=4)
    aborted = {r.request_id: (k, r) for k, r in results if not r.committed}
    # garbage: not even a request id to read -> keyed by the record's key, id "@partition:offset"
    (garbage,) = [(k, r) for rid, (k, r) in aborted.items() if rid.startswith("@0:")]
    assert garbage[0] == b"evil" and garbage[1].reason == "undecodable"
    assert garbage[1].request_id == f"@0:{garbage[1].request_offset}"
    assert garbage[1].kind.value == "validation"
    # a newer envelope version: refused, answered under the id it carries
    assert aborted[good_id][1].reason == "unsupported_version"
    # a truncated body: the id still reads
    assert aborted[bad_id][1].reason == "undecodable"
    # still serving
    assert (
        client.begin()
        .insert(T, [{"id": 1, "name": "a", "price": 1.0}])
        .commit(timeout=30)
        .commit_ts
        > 0
    )


def test_many_concurrent_transactions_per_client(tn: RunningTn, client: Client) -> None:
    setup_table(client)
    n_threads, per_thread = 8, 25
    results: list[CommitResult] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        try:
            futures = []
            for i in range(per_thread):
                txn = client.begin()
                txn.insert(T, [{"id": w * 1000 + i, "name": f"w{w}", "price": float(i)}])
                futures.append(txn.commit_async())
            for f in futures:
                r = f.result(timeout=60)
                with lock:
                    results.append(r)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert len(results) == n_threads * per_thread
    assert len({r.request_id for r in results}) == len(results)
    assert len(rows_of(tn)) == n_threads * per_thread
    # every row is visible exactly from its transaction's commit ts on
    by_ts = sorted(results, key=lambda r: r.commit_ts)
    mid = by_ts[len(by_ts) // 2].commit_ts
    assert len(rows_of(tn, ts=mid)) == sum(1 for r in results if r.commit_ts <= mid)


def test_grouped_inserts_commit_together_and_a_bad_member_aborts_alone(
    tn: RunningTn, client: Client, kwal_config: KwalConfig
) -> None:
    setup_table(client)
    client.begin().insert(T, [{"id": 5, "name": "old", "price": 0.0}]).commit(timeout=30)
    p = Producer(kwal_config.kafka_client(**{"linger.ms": 50}))  # one batch: one consume
    # independent inserts sent together run as one engine transaction
    clean = [uuid.uuid4().hex for _ in range(5)]
    for i, rid in enumerate(clean):
        rows = pa.table({"id": [200 + i], "name": ["g"], "price": [1.0]})
        req = TxnRequest(rid, "grp", (TxnOp(OpKind.INSERT, "shop", "items", rows=rows),))
        p.produce(kwal_config.topics.requests, key=b"grp", value=encode_request(req))
    p.flush(10)
    grouped = [r for _, r in raw_results(kwal_config, want=7) if r.request_id in clean]
    assert len(grouped) == 5 and all(r.committed for r in grouped)
    assert len({r.commit_ts for r in grouped}) < 5
    # a member that fails breaks its group up: the others still commit
    ids = [uuid.uuid4().hex for _ in range(6)]
    for i, rid in enumerate(ids):
        key = 5 if i == 3 else 100 + i  # member 3 collides with a committed row
        rows = pa.table({"id": [key], "name": [f"n{i}"], "price": [float(i)]})
        req = TxnRequest(rid, "grp", (TxnOp(OpKind.INSERT, "shop", "items", rows=rows),))
        p.produce(kwal_config.topics.requests, key=b"grp", value=encode_request(req))
    p.flush(10)
    results = {r.request_id: r for _, r in raw_results(kwal_config, want=13) if r.request_id in ids}
    assert len(results) == 6
    assert results[ids[3]].reason == "duplicate_key" and not results[ids[3]].committed
    ok = [results[rid] for i, rid in enumerate(ids) if i != 3]
    assert all(r.committed for r in ok)
    got = rows_of(tn)
    assert got[5]["name"] == "old"
    assert sorted(got) == [5, 100, 101, 102, 104, 105, 200, 201, 202, 203, 204]


def test_duplicate_request_id_runs_once(
    tn: RunningTn, client: Client, kwal_config: KwalConfig
) -> None:
    setup_table(client)
    rid = uuid.uuid4().hex
    req = TxnRequest(
        rid, "dup", (TxnOp(OpKind.INSERT, "shop", "items", rows=pa.table({"id": [42]})),)
    )
    p = Producer(kwal_config.kafka_client())
    p.produce(kwal_config.topics.requests, key=b"dup", value=encode_request(req))
    p.flush(10)
    first = [r for _, r in raw_results(kwal_config, want=2) if r.request_id == rid]
    assert first and first[0].committed
    # the same id again, then again after a restart of the service
    p.produce(kwal_config.topics.requests, key=b"dup", value=encode_request(req))
    p.flush(10)
    tn.restart()
    p.produce(kwal_config.topics.requests, key=b"dup", value=encode_request(req))
    p.flush(10)
    marker = client.begin().insert(T, [{"id": 43, "name": "m", "price": 0.0}]).commit(timeout=30)
    assert marker.commit_ts > first[0].commit_ts
    results = [r for _, r in raw_results(kwal_config, want=5) if r.request_id == rid]
    assert len(results) == 3  # one answer per copy sent, all the first one's
    assert all(r.committed and r.commit_ts == first[0].commit_ts for r in results)
    assert not [r for _, r in raw_results(kwal_config, want=5) if r.reason == "internal"]
    assert sorted(rows_of(tn)) == [42, 43]


def test_copies_arriving_while_the_first_commits_each_get_an_answer(
    kwal_config: KwalConfig, client_factory: Any
) -> None:
    """Copies of one request id consumed while the first copy is still committing
    (a slow log: 300 ms per append) are not executed again, and each copy gets
    its own answer: the first copy's result, naming the copy's request offset."""
    ensure_topics(kwal_config)
    engine = Engine(LogStore(SlowDriver(delay_s=0.3)))
    running = RunningTn(kwal_config, engine)
    try:
        setup_table(client_factory())
        rid = uuid.uuid4().hex
        req = TxnRequest(
            rid, "dup", (TxnOp(OpKind.INSERT, "shop", "items", rows=pa.table({"id": [7]})),)
        )
        p = Producer(kwal_config.kafka_client())
        for _ in range(3):  # one flush: the TN consumes all three in one batch
            p.produce(kwal_config.topics.requests, key=b"dup", value=encode_request(req))
        p.flush(10)
        results = [r for _, r in raw_results(kwal_config, want=5) if r.request_id == rid]
        assert len(results) == 3
        assert len({r.commit_ts for r in results}) == 1 and results[0].committed
        assert len({r.request_offset for r in results}) == 3
        assert sorted(rows_of(running)) == [7]
    finally:
        running.service.stop(drain_timeout_s=5)
        engine.close()


def test_a_request_acknowledged_without_an_offset_is_sent_again_outside_the_callback(
    tn: RunningTn, client: Client, kwal_config: KwalConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request's delivery report has no offset (the embedded broker's duplicate-sequence
    answer after a restart): the client sends the request again, from the poll thread and
    not inside the delivery callback; the TN runs it once and the commit succeeds."""
    setup_table(client)
    hidden: list[int | None] = []
    in_callback = threading.local()
    sends_in_callback: list[bool] = []
    real = Client._produce_request

    def produce_request(self: Client, payload: bytes, on_delivery: Any, poll: bool = False) -> None:
        def wrapped(err: Any, msg: Any) -> None:
            if err is None and not hidden:
                hidden.append(msg.offset())
                msg = NoOffset(msg)
            in_callback.on = True
            try:
                on_delivery(err, msg)
            finally:
                in_callback.on = False

        sends_in_callback.append(getattr(in_callback, "on", False))
        real(self, payload, wrapped, poll)

    monkeypatch.setattr(Client, "_produce_request", produce_request)
    txn = client.begin().insert(T, [{"id": 7, "name": "seven", "price": 7.0}])
    result = txn.commit(timeout=30)
    assert result.commit_ts > 0 and len(hidden) == 1
    assert sends_in_callback == [False, False]  # the request, then its copy
    client.flush(10)
    assert sorted(rows_of(tn)) == [7]
    copies = [r for _, r in raw_results(kwal_config, want=3) if r.request_id == txn.request_id]
    assert len(copies) == 2 and all(r.commit_ts == result.commit_ts for r in copies)


def test_a_transaction_above_the_brokers_default_record_size_commits(
    tn: RunningTn, client: Client, kwal_config: KwalConfig
) -> None:
    """Brokers take ~1 MB records by default; kwal's topics and producers take what the
    TN accepts (tn.max_request_bytes), so a 3 MB transaction commits whole."""
    setup_table(client)
    rows = [{"id": i, "name": "x" * 30_000, "price": float(i)} for i in range(100)]
    assert client.begin().insert(T, rows).commit(timeout=60).commit_ts > 0
    got = rows_of(tn)
    assert sorted(got) == list(range(100)) and got[42]["name"] == "x" * 30_000


def test_a_transaction_above_the_limit_is_refused_before_it_is_sent(
    tn: RunningTn, client: Client, kwal_config: KwalConfig
) -> None:
    setup_table(client)
    kwal_config.tn.max_request_bytes = 200_000  # the client reads this config object
    ends = Consumer(kwal_config.kafka_client(**{"group.id": "t-ends"}))
    try:
        before = ends.get_watermark_offsets(TopicPartition(kwal_config.topics.requests, 0), timeout=10)
        txn = client.begin().insert(T, [{"id": 1, "name": "x" * 300_000, "price": 1.0}])
        with pytest.raises(ValidationError, match=r"above tn.max_request_bytes=200000") as info:
            txn.commit(timeout=30)
        assert info.value.code == "oversized"
        after = ends.get_watermark_offsets(TopicPartition(kwal_config.topics.requests, 0), timeout=10)
    finally:
        ends.close()
    assert after == before  # nothing reached the requests topic
    assert rows_of(tn) == {}


def test_a_requests_reader_that_stopped_fetching_is_assigned_again(
    tn: RunningTn, client: Client, kwal_config: KwalConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TN's requests reader stops fetching with records waiting (librdkafka after a
    broker restart; here: its real consumer's partition paused under it): after
    tn.requests_stall_s the TN assigns the partition again at its position, and the
    waiting commit goes through (without the check it never does). Nothing is read
    twice: one row, one result (the stall: tests/stalled_reader.py)."""
    kwal_config.tn.requests_stall_s = 1.0  # the service reads this config object
    setup_table(client)
    reader = StalledReader(monkeypatch, service_module, "requests")
    before = reader.reassigned()
    reader.stall()
    result = client.begin().insert(T, [{"id": 1, "name": "a", "price": 1.0}]).commit(timeout=30)
    assert result.commit_ts > 0
    assert sorted(rows_of(tn)) == [1]
    # at least once: on a busy machine the fresh fetch can outlast the (doubled) wait
    # before the next check, which assigns again (infra.reader_stall, step 4)
    assert reader.reassigned() >= before + 1


def test_a_results_reader_that_stopped_fetching_is_assigned_again(
    tn: RunningTn, client_factory: Callable[..., Client], kwal_config: KwalConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The clients' results reader stops fetching with results waiting (here: its real
    consumer's partitions paused under it, on its own thread): after
    client.results_stall_s it is assigned again at the record after the last it read, and
    the waiting commit gets its result (without the check it times out). Nothing is lost:
    the next commit's result comes too."""
    kwal_config.client.results_stall_s = 1.0  # read when the client's results reader starts
    client = client_factory()
    setup_table(client)
    reader = StalledReader(monkeypatch, client_module, "results")
    before = reader.reassigned()
    reader.stall()
    first = client.begin().insert(T, [{"id": 1, "name": "a", "price": 1.0}]).commit(timeout=30)
    second = client.begin().insert(T, [{"id": 2, "name": "b", "price": 2.0}]).commit(timeout=30)
    assert 0 < first.commit_ts < second.commit_ts
    assert sorted(rows_of(tn)) == [1, 2]
    # at least once: on a busy machine the fresh fetch can outlast the (doubled) wait
    # before the next check, which assigns again (infra.reader_stall, step 4)
    assert reader.reassigned() >= before + 1
