"""Commit throughput of the in-process engine (MemoryDriver): 64 threads of 1-row inserts.

Prints the measured rate; the assertion is only a floor, because the machine the suite
runs on is shared. `python -m tests.tn.test_throughput` runs the measurement alone.
"""

from __future__ import annotations

import threading
import time

from tests.tn.helpers import new_engine, setup_table
from tn.engine import Engine


def measure(threads: int = 64, per_thread: int = 200) -> dict[str, float]:
    e, _ = new_engine()
    setup_table(e)
    _run(e, 1, 300, base=-1_000_000)  # warm up (pyarrow's first conversions are slow)
    t0, c0 = time.perf_counter(), time.process_time()
    _run(e, threads, per_thread)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = threads * per_thread
    assert e.read("db", "t").num_rows == n + 300
    e.close()
    return {"threads": threads, "txns": n, "tps": n / wall, "tps_per_cpu_second": n / cpu}


def _run(e: Engine, threads: int, per_thread: int, base: int = 0) -> None:
    def client(i: int) -> None:
        for j in range(per_thread):
            txn = e.begin()
            txn.insert("db", "t", [{"id": base + i * 1_000_000 + j, "v": "x"}])
            txn.commit().result(timeout=60)

    ts = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def test_commit_throughput_64_threads() -> None:
    r = measure()
    print(f"\ncommit throughput: {r}")
    assert r["tps"] > 300


if __name__ == "__main__":
    for th in (1, 16, 64):
        print(measure(th, 4000 // th if th > 1 else 3000))
