"""`kwal bench commit`: committed transactions/s and client-observed commit latency.

The real path: `producers.Client` -> requests topic -> TN (a subprocess, WAL on
cfg.wal.backend: the Kafka WAL by default, or files in a temp dir) -> WAL -> results topic ->
client. For 1, 16 and 64 concurrent clients (each its own `Client`, with one
1-row insert transaction in flight at a time: the next is sent when the
previous one's result arrives) for `--seconds` each.

Before those, the saturated phases (`ops.bench.saturated`): clients pipelining many
commits each (``tps_saturated_1row``, ``rows_per_s_1000row``, CPU per commit, the TN's
RSS over ``--saturated-seconds``) and, first of all, the broker's raw produce rate in
the same run (``raw_kafka_msgs_per_s``). ``--saturated-only`` stops after them.

Then the ceiling (`ops.bench.echo`): the same request -> result round trip
through the broker with no TN at all (an echo subprocess), driven the same
way: ``echo_tps_<n>``, ``echo_p50_ms_<n>``, and ``vs_echo_64`` (kwal's rate at
64 clients as a fraction of it). No commit routed through Kafka topics on
this broker and machine can be faster than the echo.

Then the same work with Kafka's own transactions: per concurrent client one
transactional producer, one transaction (begin, produce one record, commit)
per write. If the broker lacks transactions, the JSON says so
(``kafka_txn_supported: false`` and the error).

Prints ONE JSON line: ``tps_<n>``, ``p50_ms_<n>``, ``p99_ms_<n>``,
``kafka_txn_tps_<n>`` ..., and ``vs_kafka_txn_64`` (kwal's rate at 64 clients
divided by the Kafka-transactions rate at 64). If nothing answers at
cfg.bootstrap, the embedded broker is started for the run and stopped after.
"""

from __future__ import annotations

import dataclasses
import itertools
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer

from infra.config import KwalConfig
from ops.bench.chained import Measured, measure_chained
from ops.bench.kafka import bench_kafka
from ops.bench.report import emit, machine_loop_ms, percentile, ratio
from ops.bench.saturated import BIG_CLIENTS, BIG_INFLIGHT, bench_raw_kafka, bench_saturated

CLIENTS = (1, 16, 64)
DB, TABLE = "bench", "t"


def _log(msg: str) -> None:
    print(f"[bench commit] {msg}", file=sys.stderr, flush=True)


def _measure(n: int, seconds: float, make_worker: Callable[[int], Callable[[], None]]) -> Measured:
    """Run n workers, each calling its op in a loop for `seconds`.
    Returns (ops done, elapsed s, latencies in ms, errors)."""
    stop = threading.Event()
    lat: list[list[float]] = [[] for _ in range(n)]
    errors = [0] * n
    ops = [make_worker(i) for i in range(n)]
    barrier = threading.Barrier(n + 1)

    def loop(i: int) -> None:
        op = ops[i]
        mine = lat[i]
        barrier.wait()
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                op()
            except Exception:  # noqa: BLE001 - counted, not fatal
                errors[i] += 1
                continue
            mine.append((time.perf_counter() - t0) * 1000)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    elapsed = time.perf_counter() - start
    samples = [x for xs in lat for x in xs]
    return len(samples), elapsed, samples, sum(errors)


def _record(out: dict[str, Any], prefix: str, n: int, measured: Measured, what: str) -> None:
    """One phase's figures under `prefix`: ``<prefix>tps_<n>``, ``<prefix>p50_ms_<n>``,
    ``<prefix>p99_ms_<n>``, ``<prefix>errors_<n>``; and a progress line."""
    done, elapsed, samples, errors = measured
    tps = out[f"{prefix}tps_{n}"] = round(done / elapsed, 1)
    p50 = out[f"{prefix}p50_ms_{n}"] = round(percentile(samples, 50), 2)
    p99 = out[f"{prefix}p99_ms_{n}"] = round(percentile(samples, 99), 2)
    out[f"{prefix}errors_{n}"] = errors
    _log(f"{what} at {n} clients: {tps}/s, p50 {p50} ms, p99 {p99} ms")


def _bench_kwal(
    cfg: KwalConfig,
    seconds: float,
    out: dict[str, Any],
    workdir: Path,
    saturated_seconds: float = 0.0,
    chained: bool = True,
    one_row: bool = True,
    big_inflight: int = BIG_CLIENTS * BIG_INFLIGHT,
    broker_pid: int | None = None,
) -> None:
    from infra.topics import ensure_topics
    from producers import Client
    from tn.service.process import TnProcess

    ensure_topics(cfg)
    tn = TnProcess(cfg, workdir)
    tn.start()
    clients: list[Client] = []
    try:
        setup = Client(cfg, client_id="bench-setup")
        clients.append(setup)
        txn = setup.begin()
        txn.create_database(DB)
        txn.create_table(f"{DB}.{TABLE}", [("id", "int64"), ("v", "int64")], "id")
        txn.commit(timeout=60)
        ids = itertools.count(1)
        for _ in range(50):  # warm up both sides
            setup.begin().insert(f"{DB}.{TABLE}", [{"id": next(ids), "v": 0}]).commit(timeout=60)
        if saturated_seconds > 0:
            assert tn.proc is not None
            bench_saturated(
                cfg,
                tn.proc.pid,
                ids,
                f"{DB}.{TABLE}",
                seconds,
                saturated_seconds,
                out,
                one_row,
                big_inflight,
                broker_pid,
            )
        for n in CLIENTS if chained else ():
            workers = [Client(cfg, client_id=f"bench-{n}-{i}") for i in range(n)]
            clients.extend(workers)

            def start(i: int, workers: list[Client] = workers) -> Future[Any]:
                c = workers[i]
                return c.begin().insert(f"{DB}.{TABLE}", [{"id": next(ids), "v": i}]).commit_async()

            _record(out, "", n, measure_chained(n, seconds, start), "kwal commits")
    finally:
        for c in clients:
            c.close()
        try:
            tn.terminate()
        except Exception:  # noqa: BLE001
            tn.kill()


def _bench_echo(cfg: KwalConfig, seconds: float, out: dict[str, Any]) -> None:
    from ops.bench.echo import EchoClients, EchoServer

    with EchoServer(cfg):
        clients = EchoClients(cfg)
        try:
            for _ in range(50):  # warm up both sides
                clients.send().result(30)
            for n in CLIENTS:
                measured = measure_chained(n, seconds, lambda i: clients.send())
                _record(out, "echo_", n, measured, "echo round trips")
        finally:
            clients.close()


def _bench_kafka_txn(cfg: KwalConfig, seconds: float, out: dict[str, Any]) -> None:
    topic = cfg.topics.name("bench-kafka-txn")
    from infra.topics import TopicSpec, ensure_topics

    ensure_topics(cfg, [TopicSpec(topic, 1, {"cleanup.policy": "delete"})])
    run_id = uuid.uuid4().hex[:8]
    try:
        probe = _txn_producer(cfg, f"kwal-bench-{run_id}-probe")
        probe.begin_transaction()
        probe.produce(topic, value=b"probe")
        probe.commit_transaction(30)
    except KafkaException as e:
        out["kafka_txn_supported"] = False
        out["kafka_txn_error"] = str(e)
        _log(f"broker lacks transactions: {e}")
        return
    out["kafka_txn_supported"] = True
    for n in CLIENTS:
        producers: list[Producer | None] = [None] * n

        def init(i: int, n: int = n, producers: list[Producer | None] = producers) -> None:
            producers[i] = _txn_producer(cfg, f"kwal-bench-{run_id}-{n}-{i}")

        t0 = time.perf_counter()
        inits = [threading.Thread(target=init, args=(i,)) for i in range(n)]
        for t in inits:
            t.start()
        for t in inits:
            t.join()
        out[f"kafka_txn_init_s_{n}"] = round(time.perf_counter() - t0, 2)

        def make(i: int, producers: list[Producer | None] = producers) -> Callable[[], None]:
            p = producers[i]
            assert p is not None
            payload = b"x" * 64

            def op() -> None:
                p.begin_transaction()
                p.produce(topic, value=payload, key=str(i))
                p.commit_transaction(30)

            return op

        _record(out, "kafka_txn_", n, _measure(n, seconds, make), "kafka transactions")
        for p in producers:
            if p is not None:
                p.flush(5)


def _txn_producer(cfg: KwalConfig, txn_id: str) -> Producer:
    p = Producer(cfg.kafka_client(**{"transactional.id": txn_id, "linger.ms": 0, "acks": "all"}))
    p.init_transactions(30)
    return p


def run(args: Any, cfg: KwalConfig) -> int:
    """The bench in a work directory of its own (the TN's log, a file WAL), removed when
    the bench completes and kept, with its path printed, when it fails."""
    workdir = Path(tempfile.mkdtemp(prefix="kwal-bench-commit-"))
    try:
        code = _run(args, cfg, workdir)
    except BaseException:
        print(f"kwal bench commit: its work directory (the TN's log) is kept: {workdir}", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    return code


def _run(args: Any, cfg: KwalConfig, workdir: Path) -> int:
    seconds = float(getattr(args, "seconds", 5.0) or 5.0)
    saturated_seconds = float(getattr(args, "saturated_seconds", 60.0) or 0.0)
    saturated_only = bool(getattr(args, "saturated_only", False))
    one_row = not bool(getattr(args, "only_1000row", False))
    big_inflight = int(getattr(args, "big_inflight", BIG_CLIENTS * BIG_INFLIGHT))
    out: dict[str, Any] = {
        "bench": "commit", "seconds": seconds, "clients": list(CLIENTS),
        "machine_loop_ms_start": machine_loop_ms(),
    }
    with bench_kafka(cfg, "commit") as (cfg, where, broker):
        out["broker"] = where
        wal = dataclasses.replace(cfg.wal)
        if wal.backend == "file":
            wal.dir = str(workdir / "wal")
        cfg = dataclasses.replace(cfg, wal=wal)
        out["wal_backend"] = wal.backend
        bench_raw_kafka(cfg, seconds, out)
        _bench_kwal(
            cfg,
            seconds,
            out,
            workdir,
            saturated_seconds,
            not saturated_only,
            one_row,
            big_inflight,
            broker.pid if broker is not None else None,
        )
        if saturated_only:
            emit(out)
            return 0
        _bench_echo(cfg, seconds, out)
        out["vs_echo_64"] = ratio(out["tps_64"], out["echo_tps_64"])
        _bench_kafka_txn(cfg, seconds, out)
        if out.get("kafka_txn_supported"):
            out["vs_kafka_txn_64"] = ratio(out["tps_64"], out["kafka_txn_tps_64"])
        else:
            out["vs_kafka_txn_64"] = None
    emit(out)
    return 0
