"""The kwal Kafka source in Structured Streaming, on the shared local SparkSession and the
real broker. Few, fast queries: each checks exactness (every record once, right columns)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from consumers.spark.source import (
    SOURCE_NAME,
    SOURCE_SCHEMA,
    builtin_kafka_available,
    kafka_stream,
    register,
)
from tests.conftest import unique
from tests.spark.helpers import create_topic, produce

pytestmark = pytest.mark.spark

QUERY_TIMEOUT_S = 120


@pytest.fixture
def source(spark: Any) -> Any:
    register(spark)
    return spark


def _stream(spark: Any, bootstrap: str, topic: str, **options: Any) -> Any:
    reader = (
        spark.readStream.format(SOURCE_NAME)
        .option("bootstrap", bootstrap)
        .option("topics", topic)
        .option("startingOffsets", "earliest")
        .option("pollTimeoutMs", 5000)
    )
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load()


def _run_available_now(df: Any, out: Path, checkpoint: Path) -> None:
    q = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert q.awaitTermination(QUERY_TIMEOUT_S), "availableNow query did not finish"
        assert q.exception() is None, q.exception()
    finally:
        q.stop()


def _rows(spark: Any, out: Path) -> list[Any]:
    return spark.read.schema(SOURCE_SCHEMA).parquet(str(out)).collect()


def _check_exact(rows: list[Any], sent: dict[tuple[int, bytes], bytes]) -> None:
    positions = [(r.partition, r.offset) for r in rows]
    assert len(positions) == len(set(positions)), "duplicates"
    got = {(r.partition, r.key): r.value for r in rows}
    assert len(rows) == len(sent)
    assert got == sent
    for part in {p for p, _ in positions}:
        offs = sorted(o for p, o in positions if p == part)
        assert offs == list(range(len(offs))), f"gap in partition {part}"


def test_available_now_exactly_once_across_restart(
    source: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    spark = source
    topic = unique("src-an-")
    create_topic(kafka_bootstrap, topic, 3)
    # several flushes: several broker batches per partition, whose reported high
    # watermark lags the real end on the embedded broker
    sent = produce(kafka_bootstrap, topic, 3, 0, 600, batches=4)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    _run_available_now(_stream(spark, kafka_bootstrap, topic), out, ckpt)
    rows = _rows(spark, out)
    _check_exact(rows, sent)
    first = rows[0]
    assert first.topic == topic and first.timestamp is not None and first.timestampType == 0
    assert first.headers[0].key == "h"

    sent.update(produce(kafka_bootstrap, topic, 3, 600, 301, batches=3))
    _run_available_now(_stream(spark, kafka_bootstrap, topic), out, ckpt)
    _check_exact(_rows(spark, out), sent)


def test_max_records_per_trigger_bounds_batches(
    source: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    spark = source
    topic = unique("src-limit-")
    create_topic(kafka_bootstrap, topic, 2)
    produce(kafka_bootstrap, topic, 2, 0, 450, batches=3)
    sizes: list[int] = []

    def record(batch: Any, _batch_id: int) -> None:
        sizes.append(batch.count())

    q = (
        _stream(spark, kafka_bootstrap, topic, maxRecordsPerTrigger=100)
        .writeStream.foreachBatch(record)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert q.awaitTermination(QUERY_TIMEOUT_S)
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
    nonempty = [s for s in sizes if s]
    assert sum(nonempty) == 450
    assert max(nonempty) <= 100
    assert nonempty[:4] == [100, 100, 100, 100]


def test_processing_time_trigger_follows_live_writes(
    source: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    spark = source
    topic = unique("src-live-")
    create_topic(kafka_bootstrap, topic, 2)
    name = unique("live")
    q = (
        _stream(spark, kafka_bootstrap, topic)
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    sent: dict[tuple[int, bytes], bytes] = {}
    try:
        for round_ in range(3):
            sent.update(produce(kafka_bootstrap, topic, 2, round_ * 50, 50, batches=2))
            time.sleep(0.3)
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        count = 0
        while time.monotonic() < deadline:
            assert q.exception() is None, q.exception()
            count = spark.sql(f"select count(*) from {name}").collect()[0][0]
            if count >= len(sent):
                break
            time.sleep(0.5)
        # the last batch of each partition arrived although the watermark lags behind it
        q.processAllAvailable()
        rows = spark.sql(f"select * from {name}").collect()
    finally:
        q.stop()
    _check_exact(rows, sent)


def test_batch_read_and_kafka_stream_columns(source: Any, kafka_bootstrap: str) -> None:
    spark = source
    topic, other = unique("src-batch-"), unique("src-batch2-")
    create_topic(kafka_bootstrap, topic, 2)
    create_topic(kafka_bootstrap, other, 1)
    sent = produce(kafka_bootstrap, topic, 2, 0, 120, batches=3)
    sent_other = produce(kafka_bootstrap, other, 1, 0, 30, batches=2)
    df = (
        spark.read.format(SOURCE_NAME)
        .option("bootstrap", kafka_bootstrap)
        .option("topics", f"{topic},{other}")
        .option("maxRecordsPerPartition", 25)  # ranges split into several Spark partitions
        .load()
    )
    assert df.rdd.getNumPartitions() == 6  # 150 offsets, at most 25 a task
    rows = df.collect()
    _check_exact([r for r in rows if r.topic == topic], sent)
    _check_exact([r for r in rows if r.topic == other], sent_other)
    part = (
        spark.read.format(SOURCE_NAME)
        .option("bootstrap", kafka_bootstrap)
        .option("topics", topic)
        .option("startingOffsets", f'{{"{topic}": {{"0": 50}}}}')
        .option("endingOffsets", f'{{"{topic}": {{"1": 10}}}}')
        .load()
    )
    # partition 0: [50, 60); partition 1: [0, 10)
    assert sorted((r.partition, r.offset) for r in part.collect()) == [
        (0, o) for o in range(50, 60)
    ] + [(1, o) for o in range(10)]
    # the built-in source's jars are on the session's classpath (consumers.spark.jars
    # delta_jars): it gives the same columns as ours
    assert builtin_kafka_available(spark) is True
    columns = [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers",
    ]
    for use_builtin in (True, False):
        stream = kafka_stream(spark, kafka_bootstrap, [topic], use_builtin=use_builtin)
        assert stream.isStreaming
        assert stream.columns == columns


def test_stop_mid_stream_and_restart_no_duplicates_no_gaps(
    source: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    spark = source
    topic = unique("src-restart-")
    create_topic(kafka_bootstrap, topic, 2)
    sent = produce(kafka_bootstrap, topic, 2, 0, 600, batches=3)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def start() -> Any:
        return (
            _stream(spark, kafka_bootstrap, topic, maxRecordsPerTrigger=200)
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ckpt))
            .trigger(processingTime="100 milliseconds")
            .start()
        )

    q = start()
    try:
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while not any(p.get("numInputRows") for p in q.recentProgress):
            assert q.exception() is None, q.exception()
            assert time.monotonic() < deadline, "no micro-batch with rows"
            time.sleep(0.1)
    finally:
        q.stop()  # mid-stream: at most 200 records per micro-batch, 3 needed
    mid = len(_rows(spark, out))
    assert 0 < mid < len(sent)

    sent.update(produce(kafka_bootstrap, topic, 2, 600, 200, batches=2))
    q = start()
    try:
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while sum(p.get("numInputRows", 0) for p in q.recentProgress) < len(sent) - mid:
            assert q.exception() is None, q.exception()
            assert time.monotonic() < deadline, "restarted query did not catch up"
            time.sleep(0.2)
        q.processAllAvailable()  # a re-run of the batch interrupted by stop() counts twice
    finally:
        q.stop()
    _check_exact(_rows(spark, out), sent)
