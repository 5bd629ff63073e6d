"""`kwal bench logtail`: commit-to-visible latency at a CN, and CN apply rate vs raw consume.

1. commit-to-visible: an engine (memory WAL, so the figure is the logtail's
   own cost) with the logtail attached commits 1-row transactions at a target
   rate (1k/s, then 10k/s: the achieved rate is reported); a CN, in its own
   process as a CN is its own node (`python -m ops.bench.logtail --cn`),
   follows the table and prints each watermark advance with the system-wide
   monotonic clock. Latency = the first moment the CN's watermark covered a
   commit's ts - the moment that commit completed on the TN.
   Both processes freeze their startup heap before the phase, as a TN and a
   CN process do (`infra.collector.freeze_startup_heap`), and the engine's
   process keeps nothing per commit that a TN would not: the memory WAL is
   truncated behind the visible LSN (a Kafka WAL keeps no entry in memory
   once it is acknowledged) and the bench keeps no commit futures. Else the
   full collections of that process walk the bench's own leftovers (~12
   tracked objects per commit) and their pauses, which grow with the run,
   land on every commit behind them (docs/perf-commit.md).
   Per rate it also prints the CPU each process spent per commit
   (`tn_cpu_us_per_commit_*`: the engine's process, commits + logtail
   publisher + the bench's loop; `cn_cpu_us_per_commit_*`: the CN process)
   and the engine process's collector pauses (`gc_pauses_*`, `gc_max_ms_*`):
   on a shared machine the latencies follow the load, CPU per commit far less.
   Where the bench started its own broker, per rate also that broker's CPU per commit
   (`broker_cpu_us_per_commit_*`, all its threads) and the part of it its JIT compiler
   threads used (`broker_jit_cpu_us_per_commit_*`): a JVM started seconds before
   the first phase still compiles Kafka's request path through it.
   The 1k/s phase runs once more after the 10k/s one (`*_1k_after`), on the same
   broker, which by then has compiled that path: beside the first 1k/s phase it
   tells kwal's latency from a fresh broker's warm-up (docs/perf-commit.md,
   "commit->visible (2)").
2. apply rate: the same table's topic is read from the start by a fresh CN
   (decode + apply) and by a raw confluent-kafka consumer (no decode), in the
   same run; `apply_vs_raw` = CN rows/s / raw rows/s (raw counts the rows
   the records carry).
"""

from __future__ import annotations

import bisect
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from consumers.core.cn import CN
from infra.collector import freeze_startup_heap
from infra.config import KwalConfig
from infra.processes import REPO, child_env
from infra.topics import ensure_topics
from ops.bench.kafka import bench_kafka
from ops.bench.report import emit, machine_loop_ms, percentile, ratio
from ops.bench.saturated import broker_cpu_s, cpu_s
from tn.engine import Engine
from tn.logstore.driver import LogStore
from tn.logstore.memory_backend import MemoryDriver
from tn.logtail.wiring import attach_logtail

ROWS_PER_TXN_APPLY = 100


class _Visibility:
    """Commit ts -> commit wall time; resolved when the CN watermark passes it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending_ts: list[int] = []
        self.pending_t: list[float] = []
        self.latencies_ms: list[float] = []

    def committed(self, ts: int) -> None:
        now = time.monotonic()
        with self.lock:
            i = bisect.bisect(self.pending_ts, ts)
            self.pending_ts.insert(i, ts)
            self.pending_t.insert(i, now)

    def watermark(self, mark: int, now: float) -> None:
        with self.lock:
            n = bisect.bisect_right(self.pending_ts, mark)
            self.latencies_ms.extend((now - t) * 1000 for t in self.pending_t[:n])
            del self.pending_ts[:n], self.pending_t[:n]


class _RemoteCN:
    """The CN process of the latency phase: its watermark advances arrive as
    "<monotonic s> <watermark>" lines on its stdout, read by a thread here."""

    def __init__(self, cfg: KwalConfig, table: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ops.bench.logtail", "--cn", table],
            cwd=REPO, env=child_env(cfg), stdout=subprocess.PIPE, text=True,
        )
        self.on_watermark: Callable[[int, float], None] | None = None
        self.mark = 0
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(60):
            self.close()
            raise RuntimeError("the bench CN process did not start within 60 s")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            when, _, mark = line.partition(" ")
            self.mark = int(mark)
            self._ready.set()
            if self.on_watermark is not None:
                self.on_watermark(self.mark, float(when))

    def wait_for(self, ts: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.mark < ts and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.mark >= ts

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _cn_main(table: str) -> None:
    """The CN process: follow `table`, print every watermark advance (and one line at start)."""
    cn = CN(KwalConfig.load(), [table])
    last = [-1]
    lock = threading.Lock()  # the start line and the CN thread's lines must not interleave

    def report(mark: int) -> None:
        with lock:
            if mark != last[0]:
                last[0] = mark
                print(f"{time.monotonic():.6f} {mark}", flush=True)

    report(0)
    cn.on_watermark = report
    freeze_startup_heap()  # as a long-running CN process does before it follows its topics
    cn.start()
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    cn.close()


class _Outcomes:
    """Counts the commits' outcomes (no future is kept: see the module docstring)."""

    def __init__(self, vis: _Visibility) -> None:
        self.vis = vis
        self.cond = threading.Condition()
        self.done = 0
        self.failed: list[BaseException] = []

    def __call__(self, fut: Any) -> None:
        err = fut.exception()
        if err is None:
            self.vis.committed(fut.result())
        with self.cond:
            self.done += 1
            if err is not None:
                self.failed.append(err)
            self.cond.notify_all()

    def wait(self, n: int, timeout_s: float) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.done >= n, timeout_s):
                raise TimeoutError(f"{n - self.done} of {n} bench commits unfinished after {timeout_s}s")
        if self.failed:
            raise RuntimeError(f"{len(self.failed)} bench commits failed, the first: {self.failed[0]!r}")


class _GcPauses:
    """The cyclic collector's pauses in this process while registered (gc.callbacks)."""

    def __init__(self) -> None:
        self.pauses_ms: list[float] = []
        self._t = 0.0

    def __call__(self, phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.pauses_ms.append((time.perf_counter() - self._t) * 1000)

    def __enter__(self) -> _GcPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_exc: object) -> None:
        gc.callbacks.remove(self)


TRUNCATE_EVERY = 256  # commits between truncations of the bench's memory WAL


def _latency_phase(
    engine: Engine,
    cn: _RemoteCN,
    rate: int,
    seconds: float,
    first_id: int,
    broker_pid: int | None = None,
) -> dict[str, float]:
    vis = _Visibility()
    outcomes = _Outcomes(vis)
    cn.on_watermark = vis.watermark
    interval = 1.0 / rate
    cpu0, cn_cpu0 = cpu_s(os.getpid()), cpu_s(cn.proc.pid)
    broker0 = broker_cpu_s(broker_pid)
    with _GcPauses() as pauses:
        start = time.perf_counter()
        n = 0
        while time.perf_counter() - start < seconds:
            due = start + n * interval
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            t = engine.begin()
            t.insert("bench", "t", [{"id": first_id + n, "v": "x"}])
            t.commit().add_done_callback(outcomes)
            n += 1
            if n % TRUNCATE_EVERY == 0:
                _truncate_visible(engine)
        outcomes.wait(n, 30)
        elapsed = time.perf_counter() - start
        deadline = time.monotonic() + 30
        while vis.pending_ts and time.monotonic() < deadline:
            time.sleep(0.01)
    tn_cpu, cn_cpu = cpu_s(os.getpid()) - cpu0, cpu_s(cn.proc.pid) - cn_cpu0
    broker = {
        f"{name}_cpu_us_per_commit": round((after - before) / n * 1e6, 1)
        for name, before, after in zip(("broker", "broker_jit"), broker0, broker_cpu_s(broker_pid), strict=True)
        if before is not None and after is not None
    }
    cn.on_watermark = None
    lat = vis.latencies_ms
    return broker | {
        "achieved_tps": round(n / elapsed, 1),
        "p50_ms": round(percentile(lat, 50), 2),
        "p99_ms": round(percentile(lat, 99), 2),
        "unresolved": len(vis.pending_ts),
        "tn_cpu_us_per_commit": round(tn_cpu / n * 1e6, 1),
        "cn_cpu_us_per_commit": round(cn_cpu / n * 1e6, 1),
        "gc_pauses": len(pauses.pauses_ms),
        "gc_max_ms": round(max(pauses.pauses_ms, default=0.0), 2),
    }


def _truncate_visible(engine: Engine) -> None:
    """Drop the memory WAL's entries (all durable at once; nothing reads them back here):
    the bench's process then holds no per-commit objects a TN would not."""
    driver = engine.log.driver
    assert isinstance(driver, MemoryDriver)
    driver.truncate(driver.last_lsn())


def _apply_phase(cfg: KwalConfig, engine: Engine, logtail: Any, txns: int) -> dict[str, float]:
    for i in range(txns):
        t = engine.begin()
        t.insert("bench", "bulk", [{"id": i * ROWS_PER_TXN_APPLY + j, "v": "y" * 16} for j in range(ROWS_PER_TXN_APPLY)])
        t.commit()
    engine.heartbeat().result(60)
    logtail.publisher.flush(60)
    rows = txns * ROWS_PER_TXN_APPLY
    target = engine.visible_ts

    t0 = time.perf_counter()
    cn = CN(cfg, ["bench.bulk"]).start()
    ok = cn.wait_for(target, "bench.bulk", timeout_s=120)
    cn_s = time.perf_counter() - t0
    applied = cn.snapshot("bench.bulk").num_rows if ok else 0
    cn.close()

    topic = cfg.topics.logtail("bench", "bulk")
    consumer = Consumer(cfg.kafka_client(**{"group.id": "bench-raw", "enable.auto.commit": False,
                                            "fetch.wait.max.ms": 50, "enable.partition.eof": True}))
    t0 = time.perf_counter()
    consumer.assign([TopicPartition(topic, 0, 0)])
    records = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        msgs = consumer.consume(1000, 0.5)
        if any(m.error() is not None for m in msgs):
            records += sum(1 for m in msgs if m.error() is None)
            break
        records += len(msgs)
    raw_s = time.perf_counter() - t0
    consumer.close()
    cn_rate = applied / cn_s if cn_s else 0.0
    raw_rate = rows / raw_s if raw_s else 0.0
    return {
        "apply_rows": applied,
        "apply_rows_per_s": round(cn_rate),
        "raw_records": records,
        "raw_rows_per_s": round(raw_rate),
        "apply_vs_raw": ratio(cn_rate, raw_rate),
    }


def run(args: Any, cfg: KwalConfig) -> int:
    seconds = float(getattr(args, "seconds", 5.0) or 5.0)
    txns = int(getattr(args, "apply_txns", 2000) or 2000)
    out: dict[str, Any] = {
        "bench": "logtail", "seconds_per_rate": seconds, "machine_loop_ms_start": machine_loop_ms(),
    }
    with bench_kafka(cfg, "logtail") as (cfg, where, broker):
        out["kafka"] = where
        out["heartbeat_ms"] = cfg.tn.heartbeat_ms
        ensure_topics(cfg)
        engine = Engine(LogStore(MemoryDriver()))
        logtail = attach_logtail(engine, cfg)
        try:
            t = engine.begin()
            t.create_database("bench")
            t.create_table("bench", "t", [("id", "int64"), ("v", "string")], "id")
            t.create_table("bench", "bulk", [("id", "int64"), ("v", "string")], "id")
            t.commit().result(30)
            cn = _RemoteCN(cfg, "bench.t")
            cn.wait_for(engine.visible_ts, timeout_s=30)
            freeze_startup_heap()  # as `kwal tn run` does once it has started
            try:
                broker_pid = broker.pid if broker is not None else None
                for i, (rate, key) in enumerate(((1000, "1k"), (10000, "10k"), (1000, "1k_after"))):
                    phase = _latency_phase(
                        engine, cn, rate, seconds, first_id=(i + 1) * 10**10, broker_pid=broker_pid
                    )
                    for k, v in phase.items():
                        out[f"{k}_{key}"] = v
            finally:
                cn.close()
            out.update(_apply_phase(cfg, engine, logtail, txns))
            out["publisher_errors"] = len(logtail.publisher.errors)
        finally:
            logtail.close()
            engine.close()
    emit(out)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--cn":
        _cn_main(sys.argv[2])
    else:
        sys.exit("usage: python -m ops.bench.logtail --cn db.table (the bench's CN process)")
