"""`kwal bench spark`: the Spark CN job's throughput and latency, beside raw decoding.

One JSON line (`ops.bench.report.emit`):

- `rows_per_s`: table rows (inserts) through the job's Kafka source (`source`: the job's,
  `consumers.spark.source.requested_source`), decoded and applied into the job's
  Delta table (`sink`: "delta"; consumers.spark.delta_sink), for `--rows` rows (default
  200,000) in transactions of `--rows-per-txn` rows, on local[2], with an availableNow
  query: rows / wall time from the query's start to its end (start/stop included);
  `batch_rows_per_s` counts only the micro-batches that carried rows; `first_batch_s`: from
  `start_query` to the first micro-batch's start;
- the same for both sources, read from the same topic into Delta outputs of their own in
  this run (the job's last): `rows_per_s_python_source` (kwal's Python Data Source),
  `rows_per_s_builtin` (Spark's `kafka` source, kwal's decoder in `mapInArrow`), likewise
  `batch_rows_per_s_*`, `spark_s_*`, `jvm_cpu_s_*`, and `faster` (docs/perf-spark.md);
- `raw_rows_per_s`: one Python process consuming the same records with confluent-kafka and
  decoding each (`decode_logtail` + the Arrow batch), in the same run; `vs_raw` =
  rows_per_s / raw_rows_per_s (target >= 0.5; `rows_per_s` target into Delta >= 100,000);
- `latency_p50_ms` / `latency_p99_ms` / `latency_max_ms`: with a 1 s processing-time
  trigger, from a record's acknowledgement by Kafka to its commit being visible in Delta
  (the table's newest Delta version records a kwal watermark at or above the record's ts,
  read with delta-rs, not Spark), over `--latency-samples` records;
- `jvm_cpu_s`: the JVM's CPU during the measured query (a local session); `tree_cpu_s`: the
  whole tree's (the driver's Python process, the JVM, Spark's Python workers: `_tree_cpu_s`);
  and `warmups`.

Steps: (1) use the broker at `cfg.bootstrap`, or start the embedded one when nothing
listens there (stopped at the end); (2) produce the records to a fresh table topic; (3)
`--warmups` (`WARMUP_QUERIES`) warm-up queries doing the same work on another table (Python
workers start, the JVM compiles its code), alternating the sources; (4) raw; (5) Spark, each
source; (6) latency, the job's source.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from infra.config import KwalConfig
from infra.processes import process_cpu_s, process_tree_cpu_s
from ops.bench.kafka import bench_kafka
from ops.bench.report import emit, percentile, ratio
from schemas.arrow_ipc import arrow_schema, table_to_ipc
from schemas.logtail import (
    COMMIT_TS,
    ROW_ID,
    Catalog,
    CatalogOp,
    Changes,
    Heartbeat,
    LogtailRecord,
    decode_logtail,
    encode_logtail,
    make_row_id,
)
from schemas.wal import ColumnDef, ColumnType, TableSchema

DB = "bench"
# Warm-up queries before the measured one, until the JVM's CPU per query is steady (a CN's
# query runs for long: its JVM has compiled its code). Measured, twelve such queries of 200k
# rows in a row on one session (JVM CPU by thread from /proc): the JVM spent 13.3 s on the
# first, 2.1-2.7 s on the 2nd-4th, 1.5-1.6 s on the 5th-7th and 0.9-1.3 s on the 8th-12th;
# its C2 compiler thread alone 5.5 s, then 0.65-1.24 s on the 2nd-7th and 0.16-0.52 s from
# the 8th. The queries' wall times fell from 3.2-3.6 s (2nd-4th) to 2.2-2.6 s (6th-12th).
WARMUP_QUERIES = 8
SCHEMA = TableSchema(
    (
        ColumnDef(1, "id", ColumnType.INT64, False),
        ColumnDef(2, "name", ColumnType.STRING),
        ColumnDef(3, "score", ColumnType.FLOAT64),
    ),
    "id",
)


def _log(msg: str) -> None:
    print(f"[bench spark] {msg}", file=sys.stderr, flush=True)


class _Writer:
    """Produces a table's logtail: create_table, then transactions of inserts."""

    def __init__(self, cfg: KwalConfig, producer: Producer, table: str) -> None:
        self.cfg = cfg
        self.p = producer
        self.table = table
        self.topic = cfg.topics.logtail(DB, table)
        self.ts = 1_000
        self.lsn = 0
        self.next_id = 0

    def _send(self, topic: str, record: LogtailRecord) -> None:
        while True:
            try:
                self.p.produce(topic, value=encode_logtail(record), partition=0)
                return
            except BufferError:
                self.p.poll(0.05)

    def create(self) -> None:
        self.ts += 1
        self.lsn += 1
        body = Catalog(CatalogOp.CREATE_TABLE, 1, SCHEMA)
        self._send(self.cfg.topics.catalog, LogtailRecord(DB, self.table, self.ts, body, 1, self.lsn))

    def txn(self, rows: int, ts: int | None = None) -> int:
        self.ts = max(self.ts + 1, ts or 0)
        self.lsn += 1
        ids = list(range(self.next_id, self.next_id + rows))
        self.next_id += rows
        batch = pa.table(
            {
                ROW_ID: pa.array([make_row_id(1 + i // 8192, i % 8192) for i in ids], pa.int64()),
                COMMIT_TS: pa.array([self.ts] * rows, pa.int64()),
                "id": pa.array(ids, pa.int64()),
                "name": pa.array([f"name-{i}" for i in ids], pa.string()),
                "score": pa.array([i * 0.5 for i in ids], pa.float64()),
            },
            schema=pa.schema(
                [pa.field(ROW_ID, pa.int64()), pa.field(COMMIT_TS, pa.int64()), *arrow_schema(SCHEMA)]
            ),
        )
        body = Changes(table_to_ipc(batch), None)
        self._send(self.topic, LogtailRecord(DB, self.table, self.ts, body, 1, self.lsn))
        return self.ts

    def heartbeat(self) -> None:
        self.ts += 1
        self._send(self.cfg.topics.catalog, LogtailRecord("", "", self.ts, Heartbeat()))
        self._send(self.topic, LogtailRecord(DB, self.table, self.ts, Heartbeat()))

    def flush(self) -> None:
        if self.p.flush(60) != 0:
            raise RuntimeError("bench: records not acknowledged within 60 s")


def _create_topics(cfg: KwalConfig, topics: list[str]) -> None:
    admin = AdminClient(cfg.kafka_client())
    futures = admin.create_topics([NewTopic(t, 1, cfg.topics.replication_factor) for t in topics])
    for f in futures.values():
        f.result(timeout=30)


def raw_decode(cfg: KwalConfig, topic: str, records: int, timeout_s: float = 120) -> tuple[float, int]:
    """Seconds for one Python process to consume `records` records of `topic` and decode each
    (Avro envelope + Arrow batch); and the rows they carried."""
    from consumers.spark.decode import count_rows

    c = Consumer(
        cfg.kafka_client(
            **{
                "group.id": f"kwal-bench-raw-{uuid.uuid4().hex[:6]}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 50,
            }
        )
    )
    try:
        t0 = time.perf_counter()
        c.assign([TopicPartition(topic, 0, 0)])
        got = rows = 0
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
                rows += count_rows(decode_logtail(m.value() or b""))
                got += 1
        return time.perf_counter() - t0, rows
    finally:
        c.close()


def _run_available_now(
    spark: Any, cfg: KwalConfig, table: str, out: Path, source: str | None = None,
    timeout_s: float = 600,
) -> tuple[float, list[dict[str, Any]]]:
    """Seconds from `start_query` to the end of an availableNow query over `table`'s topic
    into `out` with `source`; and each micro-batch's progress (`rows`, Spark's durationMs,
    `start_s`: its start, in seconds after `start_query` was called)."""
    from datetime import datetime

    from consumers.spark.job import start_query

    wall0 = time.time()
    t0 = time.perf_counter()
    q = start_query(
        spark,
        cfg.bootstrap,
        cfg.topics.catalog,
        {f"{DB}.{table}": cfg.topics.logtail(DB, table)},
        out,
        trigger="available-now",
        source=source,
    )
    try:
        if not q.awaitTermination(timeout_s):
            raise RuntimeError(f"bench: spark query did not finish within {timeout_s}s")
        if q.exception() is not None:
            raise RuntimeError(f"bench: spark query failed: {q.exception()}")
        elapsed = time.perf_counter() - t0
        progress = []
        for p in q.recentProgress:
            began = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
            progress.append(
                {"rows": p.get("numInputRows"), "start_s": round(began - wall0, 3),
                 **p.get("durationMs", {})}
            )
    finally:
        q.stop()
    return elapsed, progress


def _latency(
    spark: Any, cfg: KwalConfig, producer: Producer, work: Path, samples: int, source: str
) -> list[float]:
    """Commit-to-visible seconds of `samples` one-row transactions, 1 s trigger."""
    from consumers.spark.delta_sink import table_path
    from consumers.spark.job import start_query

    table = f"lat{uuid.uuid4().hex[:6]}"
    _create_topics(cfg, [cfg.topics.logtail(DB, table)])
    w = _Writer(cfg, producer, table)
    w.create()
    w.txn(1)
    w.flush()
    out = work / "latency"
    name = f"{DB}.{table}"
    path = table_path(str(out), name)
    q = start_query(
        spark, cfg.bootstrap, cfg.topics.catalog, {name: w.topic}, out, trigger="1s",
        source=source,
    )
    lat: list[float] = []
    try:
        deadline = time.monotonic() + 120
        while True:  # the first batches (catch-up) are not measured
            if _delta_watermark(path) >= w.ts:
                break
            if time.monotonic() > deadline or q.exception() is not None:
                raise RuntimeError(f"bench latency: the job did not catch up: {q.exception()}")
            time.sleep(0.05)
        for i in range(samples):
            time.sleep(0.37 * (i % 3))  # land at different points of the trigger interval
            ts = w.txn(1, ts=time.time_ns() // 1000)
            # the catalog watermark must move too (the TN's heartbeat does that)
            w.ts -= 1
            w.heartbeat()
            w.flush()
            acked = time.perf_counter()
            limit = time.monotonic() + 60
            while True:
                if _delta_watermark(path) >= ts:
                    lat.append(time.perf_counter() - acked)
                    break
                if time.monotonic() > limit or q.exception() is not None:
                    raise RuntimeError(f"bench latency: ts {ts} not visible: {q.exception()}")
                time.sleep(0.01)
    finally:
        q.stop()
    return lat


def _delta_watermark(path: str) -> int:
    """The kwal watermark the newest Delta version at `path` records (0: no table or no
    kwal version yet), read with delta-rs: a reader that is not the job."""
    import json

    import deltalake
    from deltalake.exceptions import TableNotFoundError

    from consumers.spark.delta_sink import WATERMARK_KEY

    try:
        history = deltalake.DeltaTable(path).history(1)
    except TableNotFoundError:
        return 0
    for commit in history:
        meta = commit.get("userMetadata")
        if meta:
            return int(json.loads(meta).get(WATERMARK_KEY, 0))
    return 0


def _jvm_pid(spark: Any) -> int | None:
    """The pid of the session's JVM when this process launched it (a local session), else
    None (spark-submit, Spark Connect)."""
    try:
        proc = spark.sparkContext._gateway.proc
    except AttributeError:
        return None
    return int(proc.pid) if proc is not None else None


def _tree_cpu_s(jvm: int) -> float | None:
    """CPU seconds so far of the query's whole process tree: this process (the driver's
    Python: the batch writer, delta-rs's commits) and the JVM's tree (Spark's Python
    workers, their daemon, a query's Python source planner: `process_tree_cpu_s`)."""
    import resource

    tree = process_tree_cpu_s(jvm)
    if tree is None:
        return None
    me = resource.getrusage(resource.RUSAGE_SELF)
    return tree + me.ru_utime + me.ru_stime


def faster_source(figures: dict[str, dict[str, Any]]) -> str:
    """The source with the higher `rows_per_s`, or "tie" when both measured the same: the
    figures are rounded to whole rows a second, and a small run can measure both alike
    (CI run w9: a tie once named the source that came first)."""
    speeds = {source: f["rows_per_s"] for source, f in figures.items()}
    best = max(speeds.values())
    leaders = [source for source, speed in speeds.items() if speed == best]
    return leaders[0] if len(leaders) == 1 else "tie"


def _sources(spark: Any) -> list[str]:
    """The sources to measure, the job's (`requested_source`: its default, or what
    KWAL_SPARK_BUILTIN_KAFKA asks for) last: both, or only the one `choose_source` allows
    when the built-in one's jars are not on the session's classpath."""
    from consumers.spark.arguments import SOURCES
    from consumers.spark.source import builtin_kafka_available, choose_source, requested_source

    if not builtin_kafka_available(spark):
        return [choose_source(spark)]
    job = requested_source()
    return [s for s in SOURCES if s != job] + [job]


def _measure(
    spark: Any, cfg: KwalConfig, table: str, out: Path, source: str, rows: int
) -> dict[str, Any]:
    """One measured availableNow query of `table` into `out` with `source`: its figures
    (module docstring), after checking the Delta table holds every row."""
    from consumers.spark.delta_sink import table_path

    jvm = _jvm_pid(spark)
    jvm_before = process_cpu_s(jvm) if jvm else None
    tree_before = _tree_cpu_s(jvm) if jvm else None
    spark_s, progress = _run_available_now(spark, cfg, table, out, source)
    jvm_after = process_cpu_s(jvm) if jvm else None
    tree_after = _tree_cpu_s(jvm) if jvm else None
    if os.environ.get("KWAL_SPARK_TIMINGS"):
        _log(f"spark ({source}) {spark_s:.3f} s; micro-batches (ms): {progress}")
    delta = table_path(str(out), f"{DB}.{table}")
    state_rows = spark.read.format("delta").load(delta).count()
    if state_rows != rows:
        raise RuntimeError(f"bench ({source}): the state holds {state_rows} rows, not {rows}")
    carried = [p for p in progress if p.get("rows")]
    batch_ms = sum(p.get("triggerExecution", 0) for p in carried)
    return {
        "rows_per_s": round(rows / spark_s),
        "batch_rows_per_s": round(rows * 1000 / batch_ms) if batch_ms else None,
        "spark_s": round(spark_s, 3),
        "first_batch_s": carried[0]["start_s"] if carried else None,
        "batches": len(carried),
        "jvm_cpu_s": round(jvm_after - jvm_before, 2)
        if jvm_before is not None and jvm_after is not None
        else None,
        "tree_cpu_s": round(tree_after - tree_before, 2)
        if tree_before is not None and tree_after is not None
        else None,
        "watermark": _delta_watermark(delta),
    }


def bench(
    spark: Any,
    cfg: KwalConfig,
    rows: int,
    rows_per_txn: int,
    samples: int,
    warmups: int = WARMUP_QUERIES,
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="kwal-bench-spark-"))
    table = f"t{uuid.uuid4().hex[:6]}"
    warm = f"w{uuid.uuid4().hex[:6]}"
    out: dict[str, Any] = {"bench": "spark", "rows": rows, "rows_per_txn": rows_per_txn}
    producer = Producer(cfg.kafka_client(**{"linger.ms": 20, "batch.num.messages": 10000}))
    try:
        _create_topics(
            cfg, [cfg.topics.catalog, cfg.topics.logtail(DB, table), cfg.topics.logtail(DB, warm)]
        )
        t0 = time.perf_counter()
        w = _Writer(cfg, producer, table)
        w.create()
        txns = math.ceil(rows / rows_per_txn)
        for i in range(txns):
            w.txn(min(rows_per_txn, rows - i * rows_per_txn))
        w.heartbeat()
        w.flush()
        out["produce_s"] = round(time.perf_counter() - t0, 3)
        records = txns + 1

        # The warm-up queries do the same work on another table (see WARMUP_QUERIES), with
        # each source in turn.
        sources = _sources(spark)
        ww = _Writer(cfg, producer, warm)
        ww.create()
        for i in range(txns):
            ww.txn(min(rows_per_txn, rows - i * rows_per_txn))
        ww.flush()
        for k in range(warmups):
            source = sources[k % len(sources)]
            _log(f"warm-up query {k + 1}/{warmups} ({source})")
            _run_available_now(spark, cfg, warm, work / f"warm{k}", source)

        _log(f"raw: {records} records")
        raw_s, raw_rows = raw_decode(cfg, w.topic, records)
        if raw_rows != rows:
            raise RuntimeError(f"bench raw: decoded {raw_rows} rows, not {rows}")
        raw_rows_per_s = rows / raw_s
        out.update(records=records, raw_rows_per_s=round(raw_rows_per_s), raw_s=round(raw_s, 3))
        # Each source reads the same topic into a Delta output of its own; the job's
        # default source last.
        figures = {}
        for source in sources:
            _log(f"spark ({source})")
            figures[source] = _measure(spark, cfg, table, work / f"run-{source}", source, rows)
        job = sources[-1]
        mine = figures[job]
        out.update(
            rows_per_s=mine["rows_per_s"],
            vs_raw=ratio(mine["rows_per_s"], raw_rows_per_s),
            batch_rows_per_s=mine["batch_rows_per_s"],
            spark_s=mine["spark_s"],
            first_batch_s=mine["first_batch_s"],
            batches=mine["batches"],
            jvm_cpu_s=mine["jvm_cpu_s"],
            tree_cpu_s=mine["tree_cpu_s"],
            watermark=mine["watermark"],
            warmups=warmups,
            sink="delta",
            source=job,
        )
        for source, name in (("kwal", "python_source"), ("builtin", "builtin")):
            f = figures.get(source, {})
            for key in ("rows_per_s", "batch_rows_per_s", "spark_s", "jvm_cpu_s", "tree_cpu_s"):
                out[f"{key}_{name}"] = f.get(key)
        if len(figures) == 2:
            out["faster"] = faster_source(figures)
        if samples:
            _log(f"latency: {samples} samples, 1 s trigger")
            lat = _latency(spark, cfg, producer, work, samples, job)
            out["latency_p50_ms"] = round(percentile(lat, 50) * 1000, 1)
            out["latency_p99_ms"] = round(percentile(lat, 99) * 1000, 1)
            out["latency_max_ms"] = round(max(lat) * 1000, 1)
            out["latency_samples"] = len(lat)
            out["trigger"] = "1s"
    finally:
        producer.flush(10)
        shutil.rmtree(work, ignore_errors=True)
    return out


def run(args: Any, cfg: KwalConfig) -> int:
    """`kwal bench spark [--rows N] [--rows-per-txn K] [--latency-samples S]`."""
    rows = int(getattr(args, "rows", 0) or 200_000)
    rows_per_txn = int(getattr(args, "rows_per_txn", 0) or 10)
    samples = getattr(args, "latency_samples", None)
    samples = 8 if samples is None else int(samples)
    warmups = getattr(args, "warmups", None)
    warmups = WARMUP_QUERIES if warmups is None else int(warmups)
    from consumers.spark.jars import delta_jars
    from consumers.spark.session import DELTA_CONF, DELTA_JOB_CONF, build_session

    with bench_kafka(cfg, "spark") as (cfg, where, _broker):
        spark = build_session(
            "kwal-bench-spark", jars=delta_jars(), conf={**DELTA_CONF, **DELTA_JOB_CONF}
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            result = bench(spark, cfg, rows, rows_per_txn, samples, warmups)
            result["broker"] = where
        finally:
            spark.stop()
    emit(result)
    return 0


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="kwal bench spark")
    ap.add_argument("--bootstrap", default="")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rows-per-txn", type=int, default=10)
    ap.add_argument("--latency-samples", type=int, default=8)
    ap.add_argument("--warmups", type=int, default=WARMUP_QUERIES)
    a = ap.parse_args()
    c = KwalConfig.load()
    if a.bootstrap:
        c = c.with_bootstrap(a.bootstrap)
    raise SystemExit(run(a, c))
