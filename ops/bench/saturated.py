"""The saturated phases of `kwal bench commit`: clients pipelining many commits each.

1. ``tps_saturated_1row``: `SAT_CLIENTS` clients (each its own `Client`), each keeping
   `SAT_INFLIGHT` one-row insert transactions in flight (a slot sends its next one when
   the previous one's result arrives), for the phase's seconds; p50/p99 of the commit
   latency beside it (``p50_ms_saturated_1row``, ``p99_ms_saturated_1row``).
2. ``rows_per_s_1000row``: `BIG_CLIENTS` clients x `BIG_INFLIGHT` transactions in flight,
   1,000 rows each (``txn_per_s_1000row``, p50/p99 beside it), and the CPU per row of
   each process on the path over the phase: ``tn_cpu_us_per_row_1000row``,
   ``clients_cpu_us_per_row_1000row`` (this process), ``broker_cpu_us_per_row_1000row``
   (the local broker the bench started, all its threads) and, part of that,
   ``broker_jit_cpu_us_per_row_1000row`` (its JIT compiler threads: a fresh JVM still
   compiles in this phase).
   ``tn_cpu_us_per_commit_1row`` / ``client_cpu_us_per_commit_1row`` /
   ``broker_cpu_us_per_commit_1row`` (``broker_jit_...`` part of it): CPU seconds the TN,
   this process (the clients) and the local broker used per commit over phase 1 -- the
   figures that stay meaningful on a loaded machine, where rates swing with the
   neighbours, and whose sum bounds the rate: 2 cores give 2e6 us of CPU a second.
3. ``tn_peak_rss_mb`` / ``tn_rss_mb_start`` / ``tn_rss_mb_end``: the TN's resident set,
   sampled every 0.5 s over the saturated 1-row phase (its length: ``--saturated-seconds``,
   60 by default) -- flat means no growth from start to end.
4. ``raw_kafka_msgs_per_s``: in the same run, on the same broker, one idempotent
   producer (acks=all, linger 2 ms) producing 100-byte records as fast as it can:
   the broker's own rate for single small records on this machine.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from infra.config import KwalConfig
from infra.processes import ThreadsCpuMeter, process_cpu_s, process_tree_cpu_s
from ops.bench.chained import Measured, measure_chained
from ops.bench.report import percentile

SAT_CLIENTS, SAT_INFLIGHT = 8, 128  # 1,024 one-row commits in flight
BIG_CLIENTS, BIG_INFLIGHT, BIG_ROWS = 4, 4, 1000


def _log(msg: str) -> None:
    print(f"[bench commit] {msg}", file=sys.stderr, flush=True)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds process `pid` has used (`process_cpu_s`). A bench's
    processes are running while it measures them: a None there is an error, raised."""
    seconds = process_cpu_s(pid)
    if seconds is None:
        raise ProcessLookupError(f"no CPU time for process {pid} in /proc")
    return seconds


def rss_mb(pid: int) -> float:
    """The resident set of process `pid` in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class RssSampler:
    """Samples a process's RSS every `interval_s` on a thread until `stop()`."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        self.pid = pid
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._interval = interval_s
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                self.samples.append(rss_mb(self.pid))
            except OSError:
                return
            if self._stop.wait(self._interval):
                return

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join(5)
        return self.samples


# the JVM's just-in-time compiler threads: a fresh broker's warm-up, not per-row work
JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")


# one meter per broker process: the JIT figure is counted per compiler thread across the
# bench's readings (`ThreadsCpuMeter`); a pid used again by a later broker has threads of
# other start times, which the meter counts as new
_JIT_METERS: dict[int, ThreadsCpuMeter] = {}


def broker_cpu_s(broker_pid: int | None) -> tuple[float | None, float | None]:
    """CPU seconds so far of the bench's own broker (its process tree) and of its JIT
    compiler threads; (None, None) when the bench runs on a broker it did not start."""
    if broker_pid is None:
        return None, None
    if broker_pid not in _JIT_METERS:
        _JIT_METERS[broker_pid] = ThreadsCpuMeter(broker_pid, JIT_THREADS)
    return process_tree_cpu_s(broker_pid), _JIT_METERS[broker_pid].read()


def _phase_cpu(
    tn_pid: int, broker_pid: int | None
) -> tuple[float, float, float | None, float | None]:
    """CPU seconds so far of the TN, of this process (the clients), of the broker's
    process tree and of its JIT compiler threads (None: no local broker)."""
    return (cpu_s(tn_pid), sum(os.times()[:2]), *broker_cpu_s(broker_pid))


# the processes of `_phase_cpu`'s readings, as its figures name them; the 1-row phase's
# fields said "client" before the others existed, and keep their names
CPU_NAMES = ("tn", "clients", "broker", "broker_jit")
CPU_NAMES_1ROW = ("tn", "client", "broker", "broker_jit")


def _per_unit(
    out: dict[str, Any],
    unit: str,
    before: tuple[float | None, ...],
    after: tuple[float | None, ...],
    count: int,
    scale: float,
    digits: int,
    names: tuple[str, ...] = CPU_NAMES,
) -> None:
    """Each process's CPU over a phase (two `_phase_cpu` readings) per unit of work
    (`count` commits or rows), as ``<process>_cpu_us_per_<unit>``; a process with no
    reading (no local broker) gets no field."""
    for name, b, a in zip(names, before, after, strict=True):
        if b is not None and a is not None:
            out[f"{name}_cpu_us_per_{unit}"] = round((a - b) / count * scale, digits)
    _log(
        f"CPU per {unit}: "
        + ", ".join(f"{n} {out.get(f'{n}_cpu_us_per_{unit}')} us" for n in names)
    )


def _record(out: dict[str, Any], name: str, m: Measured, rows: int) -> None:
    done, elapsed, samples, errors = m
    tps = done / elapsed if elapsed else 0.0
    out[f"p50_ms_{name}"] = round(percentile(samples, 50), 2)
    out[f"p99_ms_{name}"] = round(percentile(samples, 99), 2)
    out[f"errors_{name}"] = errors
    if rows == 1:
        out[f"tps_{name}"] = round(tps, 1)
    else:
        out[f"txn_per_s_{name}"] = round(tps, 1)
        out[f"rows_per_s_{name}"] = round(tps * rows)
    _log(
        f"{name}: {tps:.0f} txn/s ({tps * rows:.0f} rows/s), p50 {out[f'p50_ms_{name}']} ms, "
        f"p99 {out[f'p99_ms_{name}']} ms, errors {errors}"
    )


def bench_saturated(
    cfg: KwalConfig,
    tn_pid: int,
    ids: itertools.count[int],
    table: str,
    seconds: float,
    saturated_seconds: float,
    out: dict[str, Any],
    one_row: bool = True,
    big_inflight: int = BIG_CLIENTS * BIG_INFLIGHT,
    broker_pid: int | None = None,
) -> None:
    """Phases 1-3 against a running TN (pid `tn_pid`), inserting into `table`; without
    `one_row` (``--only-1000row``) the 1,000-row phase alone (to profile it).
    `big_inflight` (``--big-inflight``): 1,000-row transactions in flight in all, over
    up to `BIG_CLIENTS` clients (the TN's CPU per row depends on it: fewer in flight,
    fewer requests share a group and a Kafka transaction). `broker_pid`: the local
    broker the bench started (its CPU per row is reported beside the TN's), or None."""
    from producers import Client

    clients = [Client(cfg, client_id=f"bench-sat-{i}") for i in range(SAT_CLIENTS)]
    try:
        out["saturated_clients"] = SAT_CLIENTS
        out["saturated_inflight_per_client"] = SAT_INFLIGHT

        if one_row:
            def one_row_txn(i: int) -> Future[Any]:
                c = clients[i % SAT_CLIENTS]
                return c.begin().insert(table, [{"id": next(ids), "v": i}]).commit_async()

            out["tn_rss_mb_start"] = round(rss_mb(tn_pid), 1)
            sampler = RssSampler(tn_pid).start()
            cpu0 = _phase_cpu(tn_pid, broker_pid)
            m = measure_chained(SAT_CLIENTS * SAT_INFLIGHT, saturated_seconds, one_row_txn)
            cpu = _phase_cpu(tn_pid, broker_pid)
            samples = sampler.stop()
            if m[0]:
                # CPU per commit: far less noisy than rates on a shared machine
                _per_unit(out, "commit_1row", cpu0, cpu, m[0], 1e6, 1, CPU_NAMES_1ROW)
            out["saturated_seconds"] = saturated_seconds
            _record(out, "saturated_1row", m, 1)
            out["tn_peak_rss_mb"] = round(max(samples, default=0.0), 1)
            out["tn_rss_mb_end"] = round(samples[-1], 1) if samples else None
            _log(
                f"TN RSS: start {out['tn_rss_mb_start']} MiB, peak {out['tn_peak_rss_mb']} MiB, "
                f"end {out['tn_rss_mb_end']} MiB"
            )

        import numpy as np
        import pyarrow as pa

        out["big_clients"] = min(BIG_CLIENTS, big_inflight)
        out["big_inflight"] = big_inflight

        def thousand(i: int) -> Future[Any]:
            c = clients[i % BIG_CLIENTS]
            # its BIG_ROWS ids in one call (C, under the GIL: no other thread takes one
            # in between); the last of them, less BIG_ROWS - 1, is the first
            first = next(itertools.islice(ids, BIG_ROWS - 1, None)) - (BIG_ROWS - 1)
            # numpy, not Python ranges: making the rows is the caller's work, not kwal's, and
            # from Python lists it was half of this process's CPU per row
            rows = pa.table(
                {
                    "id": pa.array(np.arange(first, first + BIG_ROWS, dtype=np.int64)),
                    "v": pa.array(np.full(BIG_ROWS, i, dtype=np.int64)),
                }
            )
            return c.begin().insert(table, rows).commit_async()

        _log(f"1000row: {seconds:g} s from now")
        cpu0 = _phase_cpu(tn_pid, broker_pid)
        m = measure_chained(big_inflight, seconds, thousand)
        if m[0]:
            # CPU per row of every process on the path: the TN, the clients (this
            # process), the local broker (when the bench started it)
            cpu = _phase_cpu(tn_pid, broker_pid)
            _per_unit(out, "row_1000row", cpu0, cpu, m[0] * BIG_ROWS, 1e6, 2)
        _record(out, "1000row", m, BIG_ROWS)
    finally:
        for c in clients:
            c.close()


def bench_raw_kafka(cfg: KwalConfig, seconds: float, out: dict[str, Any]) -> None:
    """Phase 4: raw produce rate of small records on the same broker."""
    from infra.topics import TopicSpec, ensure_topics

    topic = cfg.topics.name("bench-raw")
    ensure_topics(cfg, [TopicSpec(topic, 1, {"cleanup.policy": "delete"})])
    p = Producer(
        cfg.kafka_client(
            **{
                "linger.ms": 2,
                "acks": "all",
                "enable.idempotence": True,
                "queue.buffering.max.messages": 500_000,
            }
        )
    )
    payload = b"x" * 100
    acked = [0]

    def done(err: Any, msg: Any) -> None:
        if err is None:
            acked[0] += 1

    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        for _ in range(1000):
            try:
                p.produce(topic, payload, on_delivery=done)
            except BufferError:
                p.poll(0.005)
        p.poll(0)
    p.flush(30)
    elapsed = time.perf_counter() - t0
    out["raw_kafka_msgs_per_s"] = round(acked[0] / elapsed)
    _log(f"raw Kafka produce: {out['raw_kafka_msgs_per_s']} records/s")
