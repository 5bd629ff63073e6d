"""The Spark CN job against the CNCore oracle, on the real broker and the shared session.

Records are written straight to the catalog and logtail topics (`tests.spark.workload`);
the oracle is `CNCore` fed the same records."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import pytest

from consumers.core.exceptions import AboveWatermarkError, TableNotFoundError
from consumers.spark.batch_writer import BatchWriter
from consumers.spark.decode import DELETE, INSERT, OFFSET, OP
from consumers.spark.job import run, start_query
from consumers.spark.progress import load_progress
from consumers.spark.reader import read_as_of, read_changes, read_state, state_ts, watermark
from infra.config import KwalConfig
from schemas.logtail import ROW_ID
from tests.spark.helpers import create_topic
from tests.spark.workload import Workload, produce

pytestmark = pytest.mark.spark

A, B, IDLE, GONE = "db.a", "db.b", "db.idle", "db.gone"
TABLES = [A, B, IDLE, GONE]
TIMEOUT_S = 180


def _rows(df: Any) -> list[dict[str, Any]]:
    return sorted(df.toArrow().to_pylist(), key=lambda r: r["id"])


def _oracle_rows(table: Any) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: r["id"])


def _topics(cfg: KwalConfig) -> dict[str, str]:
    return {t: cfg.topics.logtail(*t.split(".", 1)) for t in TABLES}


def _create_topics(cfg: KwalConfig) -> None:
    for topic in [cfg.topics.catalog, *_topics(cfg).values()]:
        create_topic(cfg.bootstrap, topic, 1)


def _wait_batches(output: Path, n: int, q: Any, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert q.exception() is None, q.exception()
        prog = load_progress(output)
        if prog is not None and prog.batch_id >= n - 1:
            return
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} batches committed within {timeout_s}s")


def _check_against_oracle(spark: Any, wl: Workload, output: Path) -> None:
    oracle = wl.oracle(TABLES)
    for table in (A, B, IDLE):
        assert watermark(output, table) == oracle.watermark(table), table
        got = _rows(read_state(spark, output, table))
        assert got == _oracle_rows(oracle.snapshot(table, state_ts(output, table))), table
    # unlike CNCore, a dropped table does not hold the job's watermark back
    assert watermark(output) == min(oracle.watermark(t) for t in (A, B, IDLE))
    with pytest.raises(TableNotFoundError):
        read_state(spark, output, GONE)


def _check_change_log(spark: Any, wl: Workload, output: Path) -> None:
    """No duplicates, no gaps: every record's offset is in the log, every row once."""
    topics = _topics(wl.cfg)
    for table in TABLES:
        changes = read_changes(spark, output, table)
        assert changes is not None, table
        log = changes.select(OP, ROW_ID, OFFSET).toArrow().to_pylist()
        sent = [r for t, r in wl.records if t == topics[table]]
        assert sorted({r[OFFSET] for r in log}) == list(range(len(sent))), f"gap in {table}"
        data = [(r[OP], r[ROW_ID]) for r in log if r[OP] in (INSERT, DELETE)]
        assert len(data) == len(set(data)), f"duplicates in {table}"
        expected = 0
        for r in sent:
            body = r.body
            for ipc in (getattr(body, "inserts", None), getattr(body, "deletes", None)):
                if ipc is not None:
                    from schemas.arrow_ipc import ipc_to_table

                    expected += ipc_to_table(ipc).num_rows
        assert len(data) == expected, table


def test_cn_job_matches_oracle_across_a_mid_stream_restart(
    spark: Any, kwal_config: KwalConfig, tmp_path: Path
) -> None:
    cfg = kwal_config
    _create_topics(cfg)
    wl = Workload(cfg)
    for t in TABLES:
        wl.create(t)
    wl.txn(IDLE, inserts=3, deletes=0, updates=0)
    wl.random_txns([A, B, GONE], 60)
    wl.block_meta(A)
    mid_ts = wl.heartbeat()
    wl.drop(GONE)
    wl.random_txns([A, B], 40)
    wl.heartbeat()
    first = len(wl.records)
    produce(cfg.bootstrap, wl.records)

    output = tmp_path / "out"
    topics = _topics(cfg)
    q = start_query(
        spark, cfg.bootstrap, cfg.topics.catalog, topics, output,
        trigger="100 milliseconds", max_records_per_trigger=25, compact_interval_s=0.5,
    )
    try:
        _wait_batches(output, 3, q)
    finally:
        q.stop()  # mid-stream: likely in the middle of a batch
    stopped_at = load_progress(output)
    assert stopped_at is not None
    assert sum(tp.change_rows for tp in stopped_at.tables.values()) < wl.change_rows

    # more changes while the job is down; the idle table only sees heartbeats
    wl.random_txns([A, B], 40, max_rows=10)
    for _ in range(3):
        last_hb = wl.heartbeat()
    produce(cfg.bootstrap, wl.records[first:])

    # the restart goes through `kwal cn spark`'s entry point
    args = argparse.Namespace(
        tables=",".join(TABLES), output=str(output), trigger="available-now", timeout=TIMEOUT_S
    )
    assert run(args, cfg) == 0

    _check_against_oracle(spark, wl, output)
    _check_change_log(spark, wl, output)
    assert watermark(output, IDLE) == last_hb  # heartbeats alone advanced the idle table

    oracle = wl.oracle(TABLES)
    mark = watermark(output)
    for ts in (mid_ts - 40, mid_ts, (mid_ts + mark) // 2, mark):
        for table in (A, B):
            assert _rows(read_as_of(spark, output, table, ts)) == _oracle_rows(
                oracle.snapshot(table, ts)
            ), (table, ts)
    # the dropped table is readable as of a ts before its drop
    gone = wl.oracle(TABLES, upto=next(i for i, (_t, r) in enumerate(wl.records) if r.commit_ts > mid_ts))
    assert _rows(read_as_of(spark, output, GONE, mid_ts)) == _oracle_rows(gone.snapshot(GONE, mid_ts))
    with pytest.raises(TableNotFoundError):
        read_as_of(spark, output, GONE, mark)
    with pytest.raises(AboveWatermarkError):
        read_as_of(spark, output, A, mark + 1)


def test_late_create_table_and_replayed_batches(
    spark: Any, kwal_config: KwalConfig, tmp_path: Path
) -> None:
    """Calls `process_batch` directly (no stream, no hints): records that arrive before their
    create_table are decoded once it arrives; a table created in the batch that carries its
    records; a batch replayed after a crash before its commit, and after it: same state, no
    duplicates."""
    cfg = kwal_config
    wl = Workload(cfg)
    wl.create(A)
    wl.random_txns([A], 30)
    wl.heartbeat()
    wl.create(B)
    wl.random_txns([A, B], 20)
    wl.heartbeat()
    rows = wl.kafka_rows()
    topic_b = cfg.topics.logtail("db", "b")
    cut = next(i for i, (t, r) in enumerate(wl.records) if r.table == "b")
    batches = [
        [r for r in rows[:cut] if r[0] != cfg.topics.catalog],  # A's records, not its create
        [r for r in rows[:cut] if r[0] == cfg.topics.catalog],  # A's create_table, late
        rows[cut:],  # B created in the batch that carries its first records
    ]
    assert all(batches) and sum(len(b) for b in batches) == len(rows)
    assert any(r[0] == topic_b for r in batches[2])
    schema = "topic string, offset bigint, value binary"
    output = tmp_path / "out"
    writer = BatchWriter(
        output, cfg.topics.catalog, {A: cfg.topics.logtail("db", "a"), B: topic_b},
        compact_interval_s=0,
    )
    writer.process_batch(spark.createDataFrame(batches[0], schema), 0)
    assert watermark(output, A) == 0
    with pytest.raises(TableNotFoundError):
        read_state(spark, output, A)
    writer.process_batch(spark.createDataFrame(batches[1], schema), 1)
    oracle = wl.oracle([A, B], upto=cut)
    assert _rows(read_state(spark, output, A)) == _oracle_rows(oracle.snapshot(A, state_ts(output, A)))

    last = spark.createDataFrame(batches[2], schema)
    writer.process_batch(last, 2)
    oracle = wl.oracle([A, B])
    expected = {t: _oracle_rows(oracle.snapshot(t, state_ts(output, t))) for t in (A, B)}
    assert {t: _rows(read_state(spark, output, t)) for t in (A, B)} == expected
    # crash after the files, before the commit: the progress file is lost, Spark replays
    (output / "_progress" / f"{2:020d}.json").unlink()
    writer.process_batch(last, 2)
    assert {t: _rows(read_state(spark, output, t)) for t in (A, B)} == expected
    for t in (A, B):
        changes = read_changes(spark, output, t)
        assert changes is not None
        data = [(r[OP], r[ROW_ID]) for r in changes.select(OP, ROW_ID).collect() if r[OP] in "ID"]
        assert len(data) == len(set(data)), t
    assert watermark(output) == oracle.watermark()
    # a replay of a committed batch is skipped
    writer.process_batch(last, 2)
    assert writer.batches_skipped == 1


def _decoded_by_the_source(
    spark: Any, bootstrap: str, writer: BatchWriter, rows: list[tuple[str, int, bytes]]
) -> Any:
    """The batch of `rows` (topic, offset, value; contiguous per topic) as the kwal source
    delivers it to a job whose query started now: read back from the broker, decoded with
    the writer's plan."""
    import json

    from consumers.spark.source import register

    assert writer.decoded is not None
    topics = sorted({*writer.tables.values(), writer.catalog_topic})
    start, end = {}, {}
    for t in topics:
        offs = [o for topic, o, _ in rows if topic == t]
        first = min(offs) if offs else 0  # no record of the topic in the batch: empty range
        start[t] = {"0": first}
        end[t] = {"0": max(offs) + 1 if offs else first}
    register(spark)
    return (
        spark.read.format("kwal-kafka")
        .option("bootstrap", bootstrap)
        .option("topics", ",".join(topics))
        .option("startingOffsets", json.dumps(start))
        .option("endingOffsets", json.dumps(end))
        .option("decode", writer.decoded.to_json())
        .load()
    )


@pytest.mark.parametrize("decoded_by", ["mapInArrow", "source"])
def test_alter_table_add_column_mid_stream_keeps_the_new_values(
    spark: Any, kwal_config: KwalConfig, tmp_path: Path, decoded_by: str
) -> None:
    """ALTER TABLE ADD COLUMN after the job planned its batch (`process_batch` directly, no
    hints): (1) the alter's catalog record in the same batch as the first rows that carry
    the column; (2) rows carrying a second new column a batch before its catalog record (the
    catalog topic lags). Neither column's values may be lost, and the watermark may not pass
    rows the job could not yet decode. Batches come either as raw records (the job decodes
    them in a `mapInArrow`, with the plan of each batch) or decoded by the kwal source from
    the broker, with the plan made when the query started."""
    from schemas.wal import ColumnType

    cfg = kwal_config
    wl = Workload(cfg)
    wl.create(A)
    wl.random_txns([A], 15)
    wl.heartbeat()
    first = len(wl.records)
    wl.alter_add(A, "extra", ColumnType.INT64)
    wl.random_txns([A], 15)
    wl.heartbeat()
    second = len(wl.records)
    wl.alter_add(A, "note", ColumnType.STRING)
    wl.random_txns([A], 15)
    wl.heartbeat()
    rows = wl.kafka_rows()
    catalog = cfg.topics.catalog
    batches = [
        rows[:first],
        rows[first:second],  # alter 1 + rows with `extra`
        [r for r in rows[second:] if r[0] != catalog],  # rows with `note`, before its alter
        [r for r in rows[second:] if r[0] == catalog],  # alter 2, late
    ]
    schema = "topic string, offset bigint, value binary"
    output = tmp_path / "out"
    writer = BatchWriter(output, catalog, {A: cfg.topics.logtail("db", "a")}, compact_interval_s=0)

    def batch(i: int) -> Any:
        if decoded_by == "source":
            return _decoded_by_the_source(spark, cfg.bootstrap, writer, batches[i])
        return spark.createDataFrame(batches[i], schema)

    if decoded_by == "source":
        _create_topics(cfg)
        produce(cfg.bootstrap, wl.records)
        writer.decoded = writer.source_plan()

    def check(upto: int) -> None:
        oracle = wl.oracle([A], upto=upto)
        got = _rows(read_state(spark, output, A))
        assert got == _oracle_rows(oracle.snapshot(A, state_ts(output, A)))

    writer.process_batch(batch(0), 0)
    check(first)
    writer.process_batch(batch(1), 1)
    check(second)
    assert any(r["extra"] is not None for r in _rows(read_state(spark, output, A)))
    alter2_ts = wl.records[second][1].commit_ts
    writer.process_batch(batch(2), 2)
    mark = watermark(output, A)
    assert mark < alter2_ts, "the watermark passed rows not yet decoded"
    first_note_ts = min(r.commit_ts for t, r in wl.records[second:] if t != catalog)
    assert state_ts(output, A) < first_note_ts, "the state claims rows not yet decoded"
    expected = _oracle_rows(wl.oracle([A], upto=second).snapshot(A, mark))
    assert _rows(read_as_of(spark, output, A, mark)) == expected
    writer.process_batch(batch(3), 3)
    check(len(wl.records))
    state = _rows(read_state(spark, output, A))
    assert any(r["note"] is not None for r in state)
    assert watermark(output, A) == wl.oracle([A]).watermark(A)


@pytest.mark.parametrize("truncated_by", ["DeleteRecords", "reported low watermark"])
def test_a_fresh_job_refuses_a_truncated_logtail_topic(
    spark: Any,
    kwal_config: KwalConfig,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    truncated_by: str,
) -> None:
    """A job without the object store builds a table from its topic's first record: on a
    topic truncated after a checkpoint it would start past the gap and show the table
    without the rows before it. It refuses to start instead, naming the topic and where it
    now starts (with the store, it starts from the checkpoint: test_bootstrap). The topic is
    truncated for real where the broker has DeleteRecords; the other case makes the
    driver's consumer report the low watermark such a broker would (the decision and the
    message, not Kafka, are under test there), so it runs on every broker."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from consumers.core.exceptions import TruncatedLogtailError
    from consumers.spark.kafka_io import EndFinder
    from infra import capabilities

    cfg = kwal_config
    _create_topics(cfg)
    wl = Workload(cfg)
    wl.create(A)
    wl.random_txns([A], 10)
    wl.heartbeat()
    produce(cfg.bootstrap, wl.records)
    topic = _topics(cfg)[A]
    if truncated_by == "DeleteRecords":
        probe = capabilities.probe_one(kwal_config, "delete_records")
        if not probe.works:
            pytest.skip(f"the broker lacks DeleteRecords (kwal doctor: {probe.detail})")
        admin = AdminClient({"bootstrap.servers": cfg.bootstrap})
        for fut in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
            fut.result(30)
    else:
        real = EndFinder.watermarks

        def reported(self: EndFinder, keys: Any) -> dict[tuple[str, int], tuple[int, int]]:
            return {k: (4 if k[0] == topic else lo, hi) for k, (lo, hi) in real(self, keys).items()}

        monkeypatch.setattr(EndFinder, "watermarks", reported)
    output = tmp_path / "out"
    with pytest.raises(TruncatedLogtailError, match=rf"{topic}\[0\] starts at offset 4"):
        start_query(spark, cfg.bootstrap, cfg.topics.catalog, {A: topic}, output)
    args = argparse.Namespace(tables=A, output=str(output), trigger="available-now", timeout=60)
    assert run(args, cfg) == 1
    # kwal cn spark gives the job the object store: with no checkpoint there, it cannot start
    assert "holds no checkpoint" in capsys.readouterr().err
    assert load_progress(output) is None  # nothing was started
