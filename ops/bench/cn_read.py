"""`kwal bench cn-read`: a CN's memory while it reads a whole table larger than its object
cache (issue 33: "one snapshot read of the 15.8M-row table took it from 395 MB to 4.8 GB").

`measure_cn_read(cfg, table)` (also called by `kwal bench scale`):

1. starts a CN in its own process (`python -m ops.bench.cn_read --cn <table>`, the config
   passed as `KWAL_*`), which bootstraps from the newest checkpoint in the config's object
   store and follows the catalog and table topics to their end (`CN.catch_up`);
2. the CN notes its RSS (`cn_rss_mb_before_read`), resets the kernel's peak-RSS mark
   (`/proc/self/clear_refs` = 5; a 5 ms sampler of the RSS as well, should the kernel
   refuse) and reads the whole table as of its watermark as a stream (`CN.scan`),
   counting the rows and dropping each batch, as `kwal cn query` does once written;
3. it prints one JSON line: `cn_read_peak_rss_growth_mb` = peak RSS during the read - RSS
   before it (target: <= 512 for a table of 8M+ rows), `cn_read_rows`,
   `cn_read_seconds`, the cache's limit and its hits and object reads.

`run` (the command): a TN engine in this process (memory WAL; logtail on the bench's
Kafka; checkpoints to a temporary folder) fills `bench.t` with `--rows` rows: large
transactions of 16 blocks each (their rows go straight to object storage, as a client's
spilled inserts do), then 1,000-row transactions updating and deleting 1% of the rows, a
checkpoint, and a tail of the same kind left in memory. Then step 1-3, one JSON line.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np
import pyarrow as pa

from consumers.core.cn import CN
from infra.config import KwalConfig
from infra.objectstore import open_store
from infra.processes import REPO, child_env
from infra.topics import ensure_topics
from ops.bench.kafka import bench_kafka
from ops.bench.report import emit

DEFAULT_ROWS = 8_000_000
TXN_ROWS = 1_000  # rows per transaction of the updates, deletes and the tail
CHURN = 0.01  # the share of rows updated, and deleted, after the load
TAIL_TXNS = 20  # transactions left in memory after the last checkpoint
MB = 1 << 20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss() -> int:
    """VmHWM: the process's peak RSS since it started or since the last reset."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class _Sampler:
    """The highest RSS seen every 5 ms (in case the kernel keeps its peak mark)."""

    def __init__(self) -> None:
        self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _rss())


def _cn_main(table: str, timeout_s: float) -> None:
    """Steps 1-3 of the module docstring, in the CN process."""
    cfg = KwalConfig.load()
    cn = CN(cfg, [table], open_store(cfg.objectstore), name="bench-cn-read").start()
    try:
        if not cn.catch_up(timeout_s):
            raise SystemExit(f"the CN did not reach the end of {table}'s topics in {timeout_s}s: {cn.errors}")
        scan = cn.scan(table)
        gc.collect()
        before = _rss()
        kernel_peak = _reset_peak()
        sampler = _Sampler()
        t0 = time.perf_counter()
        rows = 0
        for batch in scan:
            rows += batch.num_rows
            del batch
        seconds = time.perf_counter() - t0
        peak = max(sampler.stop(), _peak_rss() if kernel_peak else 0)
        out = {
            "cn_rss_mb_before_read": round(before / MB, 1),
            "cn_read_peak_rss_growth_mb": round((peak - before) / MB, 1),
            "cn_read_rows": rows,
            "cn_read_seconds": round(seconds, 2),
            "cn_read_rows_per_s": round(rows / seconds) if seconds else 0,
            "cn_cache_mb": round(cfg.cn.cache_bytes / MB, 1),
            "cn_cache_hits": cn.blocks.hits,
            "cn_object_reads": cn.blocks.reads,
            "cn_read_ts": scan.ts,
        }
    finally:
        cn.close()
    print(json.dumps(out), flush=True)


def measure_cn_read(cfg: KwalConfig, table: str, timeout_s: float = 600.0) -> dict[str, Any]:
    """A CN process follows `table` to the end of its topics, then reads the whole table
    (steps 1-3 of the module docstring); its figures."""
    res = subprocess.run(
        [sys.executable, "-m", "ops.bench.cn_read", "--cn", table, str(timeout_s)],
        cwd=REPO, env=child_env(cfg), capture_output=True, text=True, timeout=timeout_s * 2,
    )
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"the bench CN process failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _fill(engine: Any, store: Any, rows: int) -> int:
    """Load `rows` rows into bench.t as large transactions, then update and delete CHURN of
    them in TXN_ROWS-row transactions. Returns the rows the table has."""
    from tn.checkpoint.compaction import MAX_OBJECT_ROWS, attach_object
    from tn.checkpoint.dump import to_parquet

    for first in range(0, rows, MAX_OBJECT_ROWS):
        ids = np.arange(first, min(rows, first + MAX_OBJECT_ROWS), dtype=np.int64)
        chunk = pa.table({"id": ids, "v": pa.array([f"value {i:012d}" for i in ids.tolist()]), "n": ids * 7})
        key = f"uploads/bench/{first}.parquet"
        store.put(key, to_parquet(chunk))
        attach_object(engine, store, "bench", "t", key)
        store.delete(key)
    step = int(1 / CHURN)
    churn = list(range(0, rows, step))
    for i in range(0, len(churn), TXN_ROWS):
        t = engine.begin()
        t.update("bench", "t", [{"id": k, "v": "updated", "n": -k} for k in churn[i : i + TXN_ROWS]])
        t.commit().result(60)
        t = engine.begin()
        t.delete("bench", "t", [k + 1 for k in churn[i : i + TXN_ROWS] if k + 1 < rows])
        t.commit().result(60)
    return rows - sum(1 for k in churn if k + 1 < rows)


def _tail(engine: Any, rows: int) -> int:
    """TAIL_TXNS transactions of new rows after the last checkpoint (kept in memory)."""
    for n in range(TAIL_TXNS):
        first = rows + n * TXN_ROWS
        t = engine.begin()
        t.insert("bench", "t", [{"id": k, "v": "tail", "n": k} for k in range(first, first + TXN_ROWS)])
        t.commit().result(60)
    return TAIL_TXNS * TXN_ROWS


def run(args: Any, cfg: KwalConfig) -> int:
    from tn.checkpoint.runner import CheckpointRunner
    from tn.engine import Engine
    from tn.logstore.driver import LogStore
    from tn.logstore.memory_backend import MemoryDriver
    from tn.logtail.wiring import attach_logtail

    rows = int(getattr(args, "rows", 0) or DEFAULT_ROWS)
    out: dict[str, Any] = {"bench": "cn-read", "rows_loaded": rows}
    with bench_kafka(cfg, "cn-read") as (cfg, where, _broker):
        out["kafka"] = where
        ensure_topics(cfg)
        store = open_store(cfg.objectstore)
        engine = Engine(LogStore(MemoryDriver()))
        logtail = attach_logtail(engine, cfg)
        runner = CheckpointRunner(
            engine, store, publish=logtail.publisher.publish_records,
            logtail_offsets=logtail.publisher.offsets,
        )
        try:
            t = engine.begin()
            t.create_database("bench")
            t.create_table("bench", "t", [("id", "int64"), ("v", "string"), ("n", "int64")], "id")
            t.commit().result(30)
            t0 = time.perf_counter()
            expected = _fill(engine, store, rows)
            if runner.checkpoint() is None or runner.errors:
                raise RuntimeError(f"the bench's checkpoint failed: {runner.errors}")
            expected += _tail(engine, rows)
            engine.heartbeat().result(60)
            if not logtail.publisher.flush(120):
                raise RuntimeError("the logtail did not flush within 120 s")
            out["fill_seconds"] = round(time.perf_counter() - t0, 1)
            out["rows_expected"] = expected
            out.update(measure_cn_read(cfg, "bench.t"))
        finally:
            logtail.close()
            engine.close()
    emit(out)
    return 0 if out.get("cn_read_rows") == out.get("rows_expected") else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--cn":
        _cn_main(sys.argv[2], float(sys.argv[3]))
    else:
        sys.exit("usage: python -m ops.bench.cn_read --cn db.table TIMEOUT_S (the bench's CN process)")
