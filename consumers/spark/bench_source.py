"""Throughput of the kwal Kafka source: rows/s from Kafka through `format("kwal-kafka")`
into a Parquet sink (trigger availableNow, local Spark), beside raw confluent-kafka
consuming the same records in one Python process.

`rows_per_s` is records / wall time from `start()` to the query's end (it includes the
query's ~1-2 s start and stop); `batch_rows_per_s` counts only the micro-batches that
carried rows (Spark's triggerExecution).

    bench_source(spark, bootstrap, records=200_000) -> dict   # for `kwal bench spark`
    python -m consumers.spark.bench_source [--bootstrap host:port] [--records N]

Without --bootstrap the command starts the embedded broker and a local[2] session, and
prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from consumers.spark.kafka_io import EndFinder
from consumers.spark.source import SOURCE_NAME, register


def _produce(bootstrap: str, topic: str, partitions: int, records: int, value_bytes: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep it alive until the result
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "compression.type": "none",
        }
    )
    pad = b"x" * max(0, value_bytes - 8)
    for i in range(records):
        while True:
            try:
                p.produce(topic, key=b"%08d" % i, value=b"%08d" % i + pad, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10000 == 0:
            p.poll(0)
    if p.flush(60) != 0:
        raise RuntimeError("bench: records not acknowledged within 60 s")


def raw_consume(
    bootstrap: str, topic: str, partitions: int, records: int, timeout_s: float = 120
) -> float:
    """Seconds for one Python process to consume `records` and touch every field."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"kwal-bench-raw-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 50,
        }
    )
    try:
        t0 = time.perf_counter()
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got = 0
        total_bytes = 0
        deadline = time.monotonic() + timeout_s
        while got < records:
            if time.monotonic() > deadline:
                raise RuntimeError(f"bench raw: {got}/{records} records within {timeout_s}s")
            for m in c.consume(min(10000, records - got), 1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"bench raw: {err}")
                key, value = m.key() or b"", m.value() or b""
                total_bytes += len(key) + len(value)
                m.offset()
                m.timestamp()
                got += 1
        return time.perf_counter() - t0
    finally:
        c.close()


def spark_to_parquet(
    spark: Any,
    bootstrap: str,
    topic: str,
    out: Path,
    timeout_s: float = 300,
    sink: str = "parquet",
    progress: list[dict[str, Any]] | None = None,
) -> float:
    """Seconds from start() to the end of an availableNow query that writes all of `topic`
    to `sink` ("parquet", or "noop" to time the source alone). Appends the query's
    micro-batch progress durations to `progress` when given."""
    register(spark)
    df = (
        spark.readStream.format(SOURCE_NAME)
        .option("bootstrap", bootstrap)
        .option("topics", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    t0 = time.perf_counter()
    q = (
        df.writeStream.format(sink)
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        if not q.awaitTermination(timeout_s):
            raise RuntimeError(f"bench: spark query did not finish within {timeout_s}s")
        if q.exception() is not None:
            raise RuntimeError(f"bench: spark query failed: {q.exception()}")
        elapsed = time.perf_counter() - t0
        if progress is not None:
            progress.extend(
                {"rows": p.get("numInputRows"), **p.get("durationMs", {})} for p in q.recentProgress
            )
    finally:
        q.stop()
    return elapsed


def bench_source(
    spark: Any,
    bootstrap: str,
    records: int = 200_000,
    partitions: int = 2,
    value_bytes: int = 64,
    warmup: bool = True,
) -> dict[str, Any]:
    """Produce `records` small records, then measure raw confluent-kafka and the Spark source
    on them. Returns the figures (rows/s, ratio to raw, seconds)."""
    tag = uuid.uuid4().hex[:8]
    topic = f"kwal-bench-src-{tag}"
    work = Path(tempfile.mkdtemp(prefix="kwal-bench-src-"))
    try:
        t0 = time.perf_counter()
        _produce(bootstrap, topic, partitions, records, value_bytes)
        produce_s = time.perf_counter() - t0
        finder = EndFinder({"bootstrap.servers": bootstrap}, timeout_s=10.0)
        try:
            ends = finder.ends(finder.partitions([topic]), probe_s=10.0)
        finally:
            finder.close()
        if sum(ends.values()) != records:
            raise RuntimeError(f"bench: topic holds {sum(ends.values())} records, not {records}")
        if warmup:  # the session's first streaming query pays for worker start-up
            wtopic = f"kwal-bench-warm-{tag}"
            _produce(bootstrap, wtopic, partitions, 1000, value_bytes)
            spark_to_parquet(spark, bootstrap, wtopic, work / "warm")
        raw_s = raw_consume(bootstrap, topic, partitions, records)
        progress: list[dict[str, Any]] = []
        spark_s = spark_to_parquet(spark, bootstrap, topic, work / "run", progress=progress)
        batch_ms = sum(p.get("triggerExecution", 0) for p in progress if p.get("rows"))
        written = spark.read.parquet(str(work / "run" / "data")).count()
        if written != records:
            raise RuntimeError(f"bench: parquet holds {written} rows, not {records}")
        rows_per_s = records / spark_s
        raw_rows_per_s = records / raw_s
        return {
            "bench": "spark-source",
            "records": records,
            "partitions": partitions,
            "value_bytes": value_bytes,
            "rows_per_s": round(rows_per_s),
            "raw_rows_per_s": round(raw_rows_per_s),
            "vs_raw": round(rows_per_s / raw_rows_per_s, 3),
            # the same without the query's start/stop (micro-batches that carried rows only)
            "batch_rows_per_s": round(records * 1000 / batch_ms) if batch_ms else None,
            "spark_s": round(spark_s, 3),
            "raw_s": round(raw_s, 3),
            "produce_s": round(produce_s, 3),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default="")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--value-bytes", type=int, default=64)
    args = ap.parse_args(argv)
    from consumers.spark.session import build_session

    broker = None
    bootstrap = args.bootstrap
    if not bootstrap:
        from infra.brokers.local import DEFAULT_BROKER, start_local_broker

        broker = start_local_broker(DEFAULT_BROKER, Path(tempfile.mkdtemp(prefix="kwal-bench-broker-")))
        bootstrap = broker.address
    spark = build_session("kwal-bench-source")
    try:
        result = bench_source(spark, bootstrap, args.records, args.partitions, args.value_bytes)
        print(json.dumps(result), flush=True)
    finally:
        spark.stop()
        if broker is not None:
            broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
