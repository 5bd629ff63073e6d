"""`kwal bench scale`: the TN's memory and throughput over a long history (issue 33).

1. a TN (engine + Kafka WAL + logtail + checkpoints every `--checkpoint-s` into a folder
   object store) runs in a child process, so its RSS is its own; `--clients` threads in it
   commit `--rows` rows in transactions of `--txn-rows` rows: 80 % new keys, 15 %
   updates and 5 % deletes of keys among the thread's last `--hot-keys` inserted
   (each thread its own keys: no conflicts between them);
2. after each checkpoint the child samples its RSS (`/proc/self/statm`, after glibc's
   `malloc_trim`: the C heap's free pages go back to the OS) and the rows committed so
   far; the collector's time is summed through `gc.callbacks`;
3. then raw Kafka: the same transactions' Arrow batches produced to a topic by one
   plain producer (acks=all) for `--kafka-seconds`: the rows/s no TN beats here;
4. then a CN process bootstraps from the newest checkpoint, follows the logtail to its
   end and reads the whole table as a stream (`ops.bench.cn_read.measure_cn_read`);
5. then a new TN process restarts on the whole history (recovery from the newest
   checkpoint and the WAL after it, as `kwal tn run` does), commits one probe
   transaction and samples its RSS: a restart must not rebuild what the history
   holds (issue 33: no full in-memory index).

Figures (ONE JSON line): `tn_bytes_per_row_retained` (least-squares slope of RSS
after checkpoints over rows committed, from `--slope-from` rows on; target <= 16),
`rows_per_s_late_vs_early` (rows/s of the last eighth of the history past
`--slope-from` and the first checkpoint over its first eighth; target >= 0.9), `points` ([rows, TN RSS MB] per checkpoint), `tn_rows_per_s`,
`kafka_rows_per_s`, `gc_share_early` / `gc_share_late` (the collector's share of the
wall time in those two segments), `index_entries_last` (the key index's size at
the last point), and step 4's `cn_rss_mb_before_read`, `cn_read_peak_rss_growth_mb`
(target <= 512), `cn_read_rows`, `cn_read_seconds`, and step 5's `tn_restart_s`
(process start to the probe's commit, imports excluded), `tn_restart_rss_mb` (after the
probe; `tn_restart_rss_mb_before`: the same process before recovery, its imports and
Kafka clients) and `tn_restart_index_entries` / `tn_restart_rows_in_memory` (what
recovery put in the key index and in unflushed blocks).

Beside them, two figures that the machine's load moves less: `cpu_s_per_mrow_early` /
`_late` and `cpu_per_row_late_vs_early` (the TN process's CPU seconds per million rows
in the same two segments: wall-clock rows/s also falls when other work takes the
cores), and `tn_bytes_per_row_of_history` (RSS fitted to rows committed AND
`rows_in_memory`, the rows of unflushed blocks at each point: the plain slope also
moves with how many rows were committed while each checkpoint ran). `--diag` adds
`diags`: what the TN holds at each checkpoint (index, blocks, filters, caches, Python's
small-object arenas, live vs free).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import itertools
import multiprocessing as mp
import os
import random
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path
from typing import Any

from infra.config import KwalConfig
from infra.topics import ensure_topics
from ops.bench.cn_read import measure_cn_read
from ops.bench.kafka import bench_kafka
from ops.bench.report import emit, ratio

DB, TABLE = "bench", "scale"
DEFAULT_ROWS = 8_000_000


def _log(msg: str) -> None:
    print(f"[bench scale] {msg}", file=sys.stderr, flush=True)


def _rss_bytes() -> int:
    """This process's RSS, after handing the C heap's free pages back to the OS
    (glibc `malloc_trim`, where there is one): what is retained, not the allocator's
    high-water mark of the busiest checkpoint interval."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _GcClock:
    """Wall time spent in the cyclic collector (gc.callbacks)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._t0 = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._t0

    def close(self) -> None:
        gc.callbacks.remove(self._cb)


def _rss_raw() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _obmalloc() -> dict[str, Any]:
    """Python's small-object allocator (sys._debugmallocstats, which writes to fd 2):
    MB in arenas, in live blocks, free in used pools, in empty pools."""
    names = {
        "arenas * 1048576 bytes/arena": "ob_arenas_mb",
        "# bytes in allocated blocks": "ob_live_mb",
        "# bytes in available blocks": "ob_free_mb",
        "unused pools * 16384 bytes": "ob_empty_pools_mb",
    }
    out: dict[str, Any] = {}
    with tempfile.TemporaryFile() as f:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        free_by_size: list[tuple[float, int]] = []
        for line in f.read().decode(errors="replace").splitlines():
            for pat, name in names.items():
                if pat in line and "=" in line:
                    out[name] = round(int(line.rsplit("=", 1)[1].replace(",", "")) / 2**20, 1)
            cells = line.split()
            if len(cells) == 5 and all(c.isdigit() for c in cells):  # class size pools used avail
                free_by_size.append((int(cells[1]) * int(cells[4]) / 2**20, int(cells[1])))
    # the size classes with the most free bytes in used pools: [size, MB]
    out["ob_free_top"] = [[size, round(mb, 1)] for mb, size in sorted(free_by_size)[-4:]]
    return out


def _diag(eng: Any, t: Any) -> dict[str, Any]:
    """What the TN holds at a checkpoint (diagnostics, `--diag`)."""
    import pyarrow as pa

    mem = t.mem if t is not None else None
    fl = mem.flushed if mem is not None else None
    reader = eng.catalog.objects
    caches = getattr(reader, "_caches", {})
    unflushed = [b for b in mem.blocks if not b.mem.flushed] if mem is not None else []
    return {
        "rss_raw_mb": round(_rss_raw() / 2**20, 1),
        "py_blocks": sys.getallocatedblocks(),
        "gc_tracked": sum(gc.get_count()),
        "pa_mb": round(pa.total_allocated_bytes() / 2**20, 1),
        "index": len(mem.index) if mem is not None else -1,
        "index_parts": mem.index.stats() if mem is not None else {},
        "by_id": len(mem.by_id) if mem is not None else -1,
        "blocks": len(mem.blocks) if mem is not None else -1,
        "unflushed_blocks": len(unflushed),
        "unflushed_rows": sum(len(b.mem) for b in unflushed),
        "unflushed_array_mb": round(sum(b.mem.nbytes() for b in unflushed) / 2**20, 1),
        "unpruned_blocks": len(mem.unpruned) if mem is not None else -1,
        "filters": len(fl) if fl is not None else -1,
        "filter_mb": round(fl.bits.nbytes / 2**20, 2) if fl is not None else -1,
        "caches": {k: len(v) for k, v in caches.items()},
        "catalog_nodes": len(eng.catalog.nodes),
        "cpu_s": round(time.process_time(), 1),
        "gc_objects": len(gc.get_objects()),
        "gc_collections": [g["collections"] for g in gc.get_stats()],
        **_obmalloc(),
    }


def _rows(keys: list[int], tag: int) -> list[dict[str, Any]]:
    return [{"id": k, "v": f"value-{k}-{tag}", "n": k * 0.5} for k in keys]


def _tn_child(cfg: KwalConfig, params: dict[str, Any], out: Any) -> None:
    """Steps 1-2 in the child process; puts the figures on `out`."""
    import logging

    from infra.objectstore import open_store
    from tn.checkpoint.runner import CheckpointRunner
    from tn.engine import Engine
    from tn.logstore.driver import LogStore
    from tn.logstore.kafka_backend import KafkaDriver
    from tn.logtail.wiring import attach_logtail

    logging.getLogger("tn.logstore.kafka_backend").setLevel(logging.WARNING)
    rows, txn_rows, clients = params["rows"], params["txn_rows"], params["clients"]
    hot = params["hot_keys"]
    driver = KafkaDriver(cfg, delete_records=None, retention_policy="warn")
    log = LogStore(driver)
    eng = Engine(log)
    txn = eng.begin()
    txn.create_database(DB)
    txn.create_table(DB, TABLE, [("id", "int64"), ("v", "string"), ("n", "float64")], "id")
    txn.commit().result(60)
    # the logtail rides the WAL's transactional producer, as in `kwal tn run`
    logtail = attach_logtail(
        eng, cfg, producer=driver.bus.channel() if driver.bus is not None else None
    )
    done = [0]  # rows committed (all threads)
    runner = CheckpointRunner(
        eng,
        open_store(cfg.objectstore),
        interval_s=params["checkpoint_s"],
        wal_bytes=1 << 40,
        publish=logtail.publisher.publish_records,
        logtail_offsets=logtail.publisher.offsets,
    )

    def table() -> Any:
        return eng.catalog.table(eng.catalog.database(DB, eng.visible_ts), TABLE, eng.visible_ts)  # type: ignore[arg-type]

    # each checkpoint: (rows committed, rows in memory at its start, wall s, CPU s of its
    # thread and its put workers, of which the index prune): is what a checkpoint costs
    # per row what rises late?
    ckpts: list[tuple[int, int, float, float, float]] = []
    pool_cpu = _CpuTally()
    runner.checkpoint = _timed_checkpoint(  # type: ignore[method-assign]
        runner, pool_cpu, lambda: (done[0], _rows_in_memory(table())), ckpts
    )
    runner.start(poll_s=0.2)
    clock = _GcClock()
    next_key = itertools.count()
    lock = threading.Lock()
    marks: list[tuple[int, float, float, float]] = []  # (rows, wall s, gc s, cpu s) per txn
    errors: list[str] = []
    n_upd, n_del = txn_rows * 15 // 100, txn_rows * 5 // 100
    n_new = txn_rows - n_upd - n_del
    t_start = time.perf_counter()

    def client(i: int) -> None:
        rng = random.Random(i)
        # the thread's recent keys: an array, not a list of ints (those would outlive
        # the rows they came with and pin the TN's allocator arenas: the RSS measured
        # is the TN's)
        mine = array("q")
        tag = 0
        while True:
            with lock:
                if done[0] >= rows:
                    return
            new = [next(next_key) for _ in range(n_new)]
            recent = len(mine) - max(0, len(mine) - hot)
            picks = (
                [mine[len(mine) - recent + j] for j in rng.sample(range(recent), n_upd + n_del)]
                if recent >= n_upd + n_del
                else mine[len(mine) - recent :].tolist()
            )
            upd, dele = picks[:n_upd], picks[n_upd:]
            tag += 1
            t = eng.begin()
            try:
                t.insert(DB, TABLE, _rows(new, tag))
                if upd:
                    t.update(DB, TABLE, _rows(upd, tag))
                if dele:
                    t.delete(DB, TABLE, dele)
                t.commit().result(120)
            except Exception as e:  # noqa: BLE001 - counted, reported
                errors.append(repr(e))
                if len(errors) > 100:
                    return
                continue
            mine.extend(new)
            if len(mine) > 4 * hot:
                del mine[: len(mine) - hot]
            with lock:
                done[0] += txn_rows
                marks.append(
                    (done[0], time.perf_counter() - t_start, clock.total, time.process_time())
                )

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for th in threads:
        th.start()
    points: list[tuple[int, int]] = []
    in_memory: list[int] = []  # rows of blocks not flushed, at each point
    diags: list[dict[str, Any]] = []
    seen = 0

    while any(th.is_alive() for th in threads):
        time.sleep(0.1)
        if runner.checkpoints != seen:
            seen = runner.checkpoints
            d = _diag(eng, table()) if params.get("diag") else None
            points.append((done[0], _rss_bytes()))
            in_memory.append(_rows_in_memory(table()))
            if d is not None:
                d["rows"] = points[-1][0]
                d["rss_mb"] = round(points[-1][1] / 2**20, 1)
                diags.append(d)
                _log(repr(d))
            _log(f"{done[0]:,} rows, TN RSS {points[-1][1] / 2**20:.0f} MB")
    elapsed = time.perf_counter() - t_start
    runner.stop()
    runner.checkpoint()
    points.append((done[0], _rss_bytes()))
    in_memory.append(_rows_in_memory(table()))
    t = eng.catalog.table(eng.catalog.database(DB, eng.visible_ts), TABLE, eng.visible_ts)  # type: ignore[arg-type]
    index_entries = len(t.mem.index) if t is not None else -1
    clock.close()
    eng.heartbeat().result(60)
    logtail.close(60.0)
    eng.close()
    log.close()
    out.put(
        {
            "points": points,
            "in_memory": in_memory,
            "marks": marks,
            "elapsed": elapsed,
            "errors": errors[:5],
            "error_count": len(errors),
            "index_entries": index_entries,
            "checkpoints": runner.checkpoints,
            "checkpoint_errors": runner.errors[:3],
            "diags": diags,
            "ckpts": ckpts,
        }
    )


def _restart_child(cfg: KwalConfig, out: Any) -> None:
    """Step 5 in a fresh process; puts its figures on `out`."""
    import logging

    from infra.objectstore import open_store
    from tn.checkpoint.recovery import recover
    from tn.logstore.driver import LogStore
    from tn.logstore.kafka_backend import KafkaDriver

    logging.getLogger("tn.logstore.kafka_backend").setLevel(logging.WARNING)
    before = _rss_bytes()
    t0 = time.perf_counter()
    log = LogStore(KafkaDriver(cfg, delete_records=None, retention_policy="warn"))
    rec = recover(log, open_store(cfg.objectstore))
    eng = rec.engine
    probe = eng.begin()
    # a key no bench client uses (they count up from 0): a write of the restarted TN
    probe.insert(DB, TABLE, [{"id": -1, "v": "probe", "n": 0.0}])
    probe.commit().result(60)
    restart_s = time.perf_counter() - t0
    t = eng.catalog.table(eng.catalog.database(DB, eng.visible_ts), TABLE, eng.visible_ts)  # type: ignore[arg-type]
    out.put(
        {
            "tn_restart_s": round(restart_s, 3),
            "tn_restart_rss_mb_before": round(before / 2**20, 1),
            "tn_restart_rss_mb": round(_rss_bytes() / 2**20, 1),
            "tn_restart_index_entries": len(t.mem.index) if t is not None else -1,
            "tn_restart_rows_in_memory": _rows_in_memory(t),
            "tn_restart_replayed": rec.replayed,
        }
    )
    eng.close()
    log.close()


def _in_child(target: Any, *args: Any) -> dict[str, Any]:
    """Run `target(*args, queue)` in a spawned process (its RSS is its own) and return
    what it put on the queue."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    child = ctx.Process(target=target, args=(*args, q), daemon=True)
    child.start()
    got: dict[str, Any] = q.get()
    child.join(60)
    return got


class _CpuTally:
    """CPU seconds of the calls wrapped by `wrap`, summed over threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.total = 0.0

    def wrap(self, fn: Any) -> Any:
        def run(*a: Any, **kw: Any) -> Any:
            c0 = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                with self.lock:
                    self.total += time.thread_time() - c0

        return run


def _timed_checkpoint(
    runner: Any, pool: _CpuTally, where: Any, out: list[tuple[int, int, float, float, float]]
) -> Any:
    """runner.checkpoint, recording its wall and CPU time (its own thread, its put
    workers' puts and block drops, the index prune) in `out` (diagnostics)."""
    import tn.checkpoint.runner as runner_mod
    from tn.memtable.table import TableData

    runner._put = pool.wrap(runner._put)
    runner_mod.drop_block_memory = pool.wrap(runner_mod.drop_block_memory)
    prune = _CpuTally()
    TableData.prune = prune.wrap(TableData.prune)  # type: ignore[method-assign]
    plain = runner.checkpoint

    def timed() -> Any:
        rows, mem = where()
        w0, c0, p0, q0 = time.perf_counter(), time.thread_time(), pool.total, prune.total
        try:
            return plain()
        finally:
            cpu = time.thread_time() - c0 + pool.total - p0
            out.append((rows, mem, time.perf_counter() - w0, cpu, prune.total - q0))

    return timed


def _rows_in_memory(t: Any) -> int:
    """Rows of the table's blocks not flushed (the working set a checkpoint left)."""
    if t is None:
        return 0
    return sum(len(b.mem) for b in list(t.mem.blocks) if not b.mem.flushed)


def _history_slope(
    points: list[tuple[int, int]], in_memory: list[int], start: int
) -> float | None:
    """RSS = a + b * rows committed + c * rows in memory, least squares over the points
    at or past `start` rows: b, the bytes each row of history adds whatever the working
    set left at that checkpoint (which the plain slope also sees: the rows committed
    while the checkpoint ran)."""
    import numpy as np

    pts = [(r, m, w) for (r, m), w in zip(points, in_memory, strict=False) if r >= start]
    if len(pts) < 4:
        return None
    a = np.array([[1.0, r, w] for r, _, w in pts])
    y = np.array([m for _, m, _ in pts], dtype=float)
    coef, _, rank, _ = np.linalg.lstsq(a, y, rcond=None)
    return float(coef[1]) if rank == 3 else None


def _slope(points: list[tuple[int, int]], start: int) -> float | None:
    """Least-squares slope of RSS over rows, for points at or past `start` rows."""
    pts = [(r, m) for r, m in points if r >= start]
    if len(pts) < 2:
        return None
    mx = sum(r for r, _ in pts) / len(pts)
    my = sum(m for _, m in pts) / len(pts)
    den = sum((r - mx) ** 2 for r, _ in pts)
    if den == 0:
        return None
    return sum((r - mx) * (m - my) for r, m in pts) / den


def _segment(
    marks: list[tuple[int, float, float, float]], lo: float, hi: float
) -> tuple[float, float, float]:
    """(rows/s, gc share, TN CPU s per million rows) between fractions lo and hi of the
    rows committed."""
    total = marks[-1][0]
    seg = [m for m in marks if lo * total <= m[0] <= hi * total]
    if len(seg) < 2:
        return 0.0, 0.0, 0.0
    (r0, t0, g0, c0), (r1, t1, g1, c1) = seg[0], seg[-1]
    dt = t1 - t0
    cpu = (c1 - c0) / (r1 - r0) * 1e6 if r1 > r0 else 0.0
    return ((r1 - r0) / dt if dt > 0 else 0.0), ((g1 - g0) / dt if dt > 0 else 0.0), cpu


def _raw_kafka(cfg: KwalConfig, txn_rows: int, seconds: float) -> float:
    """Step 3: rows/s of the transactions' Arrow batches through a plain producer."""
    from confluent_kafka import Producer

    from schemas.arrow_ipc import table_to_ipc
    from schemas.wal import ColumnDef, ColumnType, TableSchema
    from tn.txn.rows import to_batch

    schema = TableSchema(
        (
            ColumnDef(1, "id", ColumnType.INT64, False),
            ColumnDef(2, "v", ColumnType.STRING),
            ColumnDef(3, "n", ColumnType.FLOAT64),
        ),
        "id",
        1,
    )
    payload = table_to_ipc(to_batch(schema, _rows(list(range(txn_rows)), 1)).arrow())
    topic = f"{cfg.topics.prefix}.raw"
    p = Producer({"bootstrap.servers": cfg.bootstrap, "acks": "all", "linger.ms": 5})
    sent = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        try:
            p.produce(topic, payload)
            sent += 1
        except BufferError:
            p.poll(0.05)
        p.poll(0)
    p.flush(60)
    return sent * txn_rows / (time.perf_counter() - t0)


def measure(cfg: KwalConfig, params: dict[str, Any]) -> dict[str, Any]:
    """Steps 1-3 (module docstring) against the broker of `cfg`."""
    with tempfile.TemporaryDirectory(prefix="kwal-bench-scale-") as tmp:
        objects = dataclasses.replace(cfg.objectstore, url=f"file://{Path(tmp) / 'objects'}")
        cfg = dataclasses.replace(cfg, objectstore=objects)
        ensure_topics(cfg)
        got = _in_child(_tn_child, cfg, params)
        cn = measure_cn_read(cfg, f"{DB}.{TABLE}")
        _log("TN restart on the history")
        restart = _in_child(_restart_child, cfg)
    points, marks = got["points"], got["marks"]
    start = params["slope_from"] or min(1_000_000, params["rows"] // 4)
    slope = _slope(points, start)
    history = _history_slope(points, got["in_memory"], start)
    # both segments in the steady state: past `start` and past the first checkpoint
    total = marks[-1][0] if marks else 0
    first = points[0][0] if len(points) > 1 else 0
    lo = min(max(start, first) / total, 0.5) if total else 0.0
    span = (1.0 - lo) / 8
    early, gc_early, cpu_early = _segment(marks, lo, lo + span)
    late, gc_late, cpu_late = _segment(marks, 1.0 - span, 1.0)
    out: dict[str, Any] = {
        "rows": marks[-1][0] if marks else 0,
        "tn_rows_per_s": round(marks[-1][0] / got["elapsed"]) if marks else 0,
        "tn_bytes_per_row_retained": round(slope, 2) if slope is not None else None,
        "slope_from_rows": start,
        "tn_bytes_per_row_of_history": round(history, 2) if history is not None else None,
        "rows_in_memory": got["in_memory"],
        "rows_per_s_early": round(early),
        "rows_per_s_late": round(late),
        "rows_per_s_late_vs_early": ratio(late, early),
        "cpu_s_per_mrow_early": round(cpu_early, 2),
        "cpu_s_per_mrow_late": round(cpu_late, 2),
        "cpu_per_row_late_vs_early": ratio(cpu_late, cpu_early),
        "gc_share_early": round(gc_early, 4),
        "gc_share_late": round(gc_late, 4),
        "points": [[r, round(m / 2**20, 1)] for r, m in points],
        "index_entries_last": got["index_entries"],
        "checkpoints": got["checkpoints"],
        "txn_errors": got["error_count"],
        **cn,
        **restart,
    }
    ck = [c for c in got["ckpts"] if c[1] > 0]
    if ck:  # [rows committed, rows in memory, wall s, CPU s, prune CPU s, CPU us per row]
        out["checkpoint_costs"] = [
            [r, m, round(w, 2), round(c, 2), round(p, 3), round(c / m * 1e6, 2)]
            for r, m, w, c, p in ck
        ]
    if got["diags"]:
        out["diags"] = got["diags"]
    if got["errors"]:
        out["txn_error_samples"] = got["errors"]
    if got["checkpoint_errors"]:
        out["checkpoint_errors"] = got["checkpoint_errors"]
    return out


def run(args: argparse.Namespace, cfg: KwalConfig) -> int:
    params: dict[str, Any] = {
        "rows": int(args.rows),
        "txn_rows": int(args.txn_rows),
        "clients": int(args.clients),
        "hot_keys": int(args.hot_keys),
        "checkpoint_s": float(args.checkpoint_s),
        "slope_from": int(args.slope_from),
        "diag": bool(getattr(args, "diag", False)),
    }
    with bench_kafka(cfg, "scale") as (cfg, where, _broker):
        cfg = dataclasses.replace(cfg, wal=dataclasses.replace(cfg.wal, backend="kafka"))
        result: dict[str, Any] = {"bench": "scale", "bootstrap": where, **params}
        _log(f"TN: {params['rows']:,} rows against {where}")
        result.update(measure(cfg, params))
        kafka = _raw_kafka(cfg, params["txn_rows"], float(args.kafka_seconds))
        result["kafka_rows_per_s"] = round(kafka)
        result["vs_kafka"] = ratio(result["tn_rows_per_s"], kafka)
    emit(result)
    return 0
