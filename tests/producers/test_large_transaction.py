"""Large transactions through object storage (issue 30, item 3; seeds 003/004).

A large transaction (numeric columns) is spilled by the client to the object store (a
real S3 API: moto's server) and committed by a real TN process on the Kafka WAL with
only object references in its WAL entry; it survives a kill -9 of the TN (replay reads
the blocks back: the keys are still known to the TN), both CNs read it whole from the
topics and the objects (the Python CN, consumers.core, and the Spark CN, a real
SparkSession), and a checkpoint covers it: the TN restarts from that checkpoint and a
Python CN starts from it with every row. 200 MB (500,000 rows of 400 bytes, in four
objects); its call took 43 s on the 2 cores when they were otherwise idle. Above
`client.max_txn_bytes` the client raises ValidationError naming the limit, and nothing
reaches the requests topic or the object store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from consumers.core.cn import CN
from consumers.spark.job import start_query
from consumers.spark.reader import read_state, watermark
from infra.config import KwalConfig, ObjectStoreConfig
from infra.objectstore import S3Store, open_store
from infra.topics import ensure_topics
from producers import Client, ValidationError
from schemas.codec import schema_of
from schemas.logtail import LARGE_TXN_SUFFIX
from tests.service.harness import recover_engine
from tests.waiting import wait_until
from tn.checkpoint.commands import run_now
from tn.service.process import TnProcess

pytestmark = [pytest.mark.spark]

TABLE = "big.t"
FLOATS = 49  # id + 49 float64 columns: 400 bytes a row
SIZES = [pytest.param(500_000, 16 * 8192, id="200MB")]  # objects of at most 131,072 rows
TIMEOUT_S = 180


def big_rows(n: int, first: int = 0) -> pa.Table:
    rng = np.random.default_rng(7)
    cols: dict[str, Any] = {"id": pa.array(np.arange(first, first + n, dtype=np.int64))}
    for i in range(FLOATS):
        cols[f"c{i}"] = pa.array(rng.random(n))
    return pa.table(cols)


def columns() -> list[tuple[str, str]]:
    return [("id", "int64"), *((f"c{i}", "float64") for i in range(FLOATS))]


def digest(t: pa.Table) -> tuple[int, int, float, float]:
    """Rows, the sum of ids, and two columns' sums (every row counted once)."""
    return (
        t.num_rows,
        int(pc.sum(t.column("id")).as_py()),
        round(float(pc.sum(t.column("c0")).as_py()), 3),
        round(float(pc.sum(t.column(f"c{FLOATS - 1}")).as_py()), 3),
    )


def requests_end(cfg: KwalConfig) -> int:
    """The requests topic's end (a topic just created may have no leader yet: polled)."""
    c = Consumer({"bootstrap.servers": cfg.bootstrap, "group.id": "large-txn-probe"})
    ends: list[int] = []

    def probe() -> bool:
        try:
            ends.append(c.get_watermark_offsets(TopicPartition(cfg.topics.requests, 0), timeout=5)[1])
        except KafkaException:
            return False
        return True

    try:
        wait_until("the requests topic's end", probe, 60, 0.2)
        return int(ends[-1])
    finally:
        c.close()


@pytest.fixture
def s3_cfg(kwal_config: KwalConfig, s3_config: ObjectStoreConfig) -> KwalConfig:
    kwal_config.objectstore = s3_config
    kwal_config.wal.backend = "kafka"
    # no scheduled checkpoint: the Spark CN reads the logtail from its start
    # (from_checkpoint="never"), and a checkpoint's truncation under a slow run had cut
    # it first (TruncatedLogtailError); the test takes its one checkpoint itself (run_now)
    kwal_config.tn.checkpoint_interval_s = 3600.0
    ensure_topics(kwal_config)
    return kwal_config


@pytest.fixture
def tn(s3_cfg: KwalConfig, tmp_path: Path) -> Iterator[TnProcess]:
    proc = TnProcess(s3_cfg, tmp_path)
    proc.start()
    try:
        with Client(s3_cfg, "setup") as client:
            t = client.begin()
            t.create_database("big")
            t.create_table(TABLE, columns(), "id")
            t.commit(timeout=60)
        yield proc
    finally:
        proc.kill()


@pytest.mark.parametrize(("n_rows", "object_rows"), SIZES)
def test_a_large_transaction_commits_survives_a_tn_restart_and_both_cns_read_it(
    s3_cfg: KwalConfig, tn: TnProcess, spark: Any, tmp_path: Path, n_rows: int, object_rows: int
) -> None:
    cfg = s3_cfg
    cfg.client.object_rows = object_rows  # the client's setting (the TN takes any up to 16 blocks)
    store = open_store(cfg.objectstore)
    assert isinstance(store, S3Store)
    rows = big_rows(n_rows)
    assert rows.nbytes == n_rows * 400 > cfg.client.spill_bytes
    expected = digest(rows)
    expected_all = digest(pa.concat_tables([rows, big_rows(1, first=n_rows)]))
    before = requests_end(cfg)
    with Client(cfg, "loader") as client:
        t = client.begin()
        t.insert(TABLE, rows)
        cts = t.commit(timeout=TIMEOUT_S).commit_ts
        # one small request went over Kafka: the rows went to the object store
        assert requests_end(cfg) == before + 1
        # the uploads are deleted once the TN answered (it wrote its own block objects)
        wait_until("the uploads deleted", lambda: not store.list("uploads/"), 30)
        blocks = [k for k in store.list("data/") if k.endswith(LARGE_TXN_SUFFIX)]
        assert len(blocks) == sum(-(-min(object_rows, n_rows - o) // 8192) for o in range(0, n_rows, object_rows))

        # the TN restarts (kill -9): replay reads the blocks back
        tn.kill()
        tn.start()
        dup = client.begin()
        dup.insert(TABLE, [{"id": n_rows - 1, **{f"c{i}": 0.0 for i in range(FLOATS)}}])
        with pytest.raises(ValidationError) as err:  # the replayed TN still knows its keys
            dup.commit(timeout=60)
        assert err.value.code == "duplicate_key"
        last = client.begin()
        last.insert(TABLE, big_rows(1, first=n_rows))
        after = last.commit(timeout=60).commit_ts
    del rows

    # the Python CN: from the topics (its blocks' metas) and the objects
    cn = CN(cfg, [TABLE], store, bootstrap=False).start()
    try:
        assert cn.wait_for(after, TABLE, timeout_s=TIMEOUT_S), cn.errors
        assert digest(cn.snapshot(TABLE, cts)) == expected
        assert cn.snapshot(TABLE, after).num_rows == n_rows + 1
        assert cn.snapshot(TABLE, cts - 1).num_rows == 0  # all of it at one commit ts
    finally:
        cn.close()

    # the Spark CN
    # 500,000 rows of 50 columns: Spark's generated code pays for itself here, unlike on the
    # few rows of the other tests, whose session this is (tests/conftest.py sets
    # interpreted expressions for it). Measured alone on 2 cores: the query 35-39 s ->
    # 31 s, the digest 9.5-12 s -> 6 s (docs/measurements.md)
    factory_mode = spark.conf.get("spark.sql.codegen.factoryMode")
    spark.conf.set("spark.sql.codegen.factoryMode", "FALLBACK")
    try:
        output = tmp_path / "spark"
        topics = {TABLE: cfg.topics.logtail("big", "t")}
        q = start_query(
            spark, cfg.bootstrap, cfg.topics.catalog, topics, output, trigger="available-now",
            from_checkpoint="never", compact_interval_s=0.0, store=store,
        )
        try:
            assert q.awaitTermination(TIMEOUT_S), "the Spark CN did not finish"
            assert q.exception() is None, q.exception()
        finally:
            q.stop()
        assert watermark(output, TABLE) >= after
        state = read_state(spark, output, TABLE)
        spark_digest = state.selectExpr(
            "count(*)", "sum(id)", "sum(c0)", f"sum(c{FLOATS - 1})", "max(id)"
        ).collect()[0]
        assert spark_digest[0] == n_rows + 1 and spark_digest[4] == n_rows
        extra = big_rows(1, first=n_rows)
        assert (
            spark_digest[0] - 1,
            spark_digest[1] - n_rows,
            round(spark_digest[2] - extra.column("c0")[0].as_py(), 3),
            round(spark_digest[3] - extra.column(f"c{FLOATS - 1}")[0].as_py(), 3),
        ) == expected
    finally:
        spark.conf.set("spark.sql.codegen.factoryMode", factory_mode)

    # a checkpoint while the TN is down covers the large blocks; the TN restarts from it,
    # and a Python CN starts from it too (their rows come from the checkpoint's objects)
    tn.kill()
    assert run_now(SimpleNamespace(json=True), cfg) == 0
    tn.start()
    cn = CN(cfg, [TABLE], store).start()
    try:
        assert cn.wait_for(after, TABLE, timeout_s=TIMEOUT_S), cn.errors
        assert cn.horizon >= after  # it started from the checkpoint
        assert digest(cn.snapshot(TABLE, cn.horizon)) == expected_all
    finally:
        cn.close()

    # and the TN's own state after a clean stop, recovered from the checkpoint
    assert tn.terminate() == 0
    engine, log = recover_engine(cfg)
    try:
        assert digest(engine.read("big", "t")) == expected_all
    finally:
        engine.close()
        log.close()


def test_above_the_maximum_the_client_raises_and_sends_nothing(s3_cfg: KwalConfig) -> None:
    cfg = s3_cfg
    cfg.client.spill_bytes = 1 << 20
    cfg.client.max_txn_bytes = 4 << 20
    store = open_store(cfg.objectstore)
    before = requests_end(cfg)
    with Client(cfg, "too-big") as client:
        t = client.begin()
        t.insert(TABLE, big_rows(12_000))  # 4.8 MB
        with pytest.raises(ValidationError, match=r"client\.max_txn_bytes=4194304") as err:
            t.commit(timeout=10)
        assert err.value.code == "oversized"
        client.flush(10)
    assert requests_end(cfg) == before
    assert store.list("") == []


def test_a_spilled_request_names_objects_and_an_old_one_stays_v1(s3_cfg: KwalConfig) -> None:
    """The wire format: a spilled request is `txn_request_v2` with object keys and no
    rows; one under the spill size is the unchanged `txn_request`."""
    from producers.spill import spill
    from schemas.requests import OpKind, TxnOp, TxnRequest, decode_request, encode_request

    cfg = s3_cfg
    store = open_store(cfg.objectstore)
    cfg.client.object_rows = 1000
    op = TxnOp(OpKind.INSERT, "big", "t", rows=big_rows(2500))
    ops, keys = spill([op], store, cfg.client, "c", "r1")
    assert len(keys) == 3 and store.list("uploads/c/r1/") == sorted(keys)
    assert ops[0].rows is None and ops[0].objects == tuple(keys)
    wire = encode_request(TxnRequest("r1", "c", tuple(ops)))
    assert schema_of(wire) == "txn_request_v2"
    assert decode_request(wire).ops[0].objects == tuple(keys)
    assert schema_of(encode_request(TxnRequest("r2", "c", (op,)))) == "txn_request"
