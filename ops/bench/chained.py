"""Closed-loop load for the benchmarks: n chains of operations, each sending its next one
when its previous one completes (`kwal bench commit`'s phases)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

Measured = tuple[int, float, list[float], int]  # ops done, elapsed s, latencies ms, errors


def measure_chained(n: int, seconds: float, start: Callable[[int], Future[Any]]) -> Measured:
    """n clients, each with exactly one transaction in flight: when one's result
    arrives (a future callback) it records the latency and sends its next one.
    Same load as n threads blocking on commit(), without n Python threads
    fighting for the GIL in the benchmark process itself."""
    stop = threading.Event()
    lock = threading.Lock()
    samples: list[float] = []
    errors = [0]
    active = [n]
    idle = threading.Event()

    def launch(i: int) -> None:
        t0 = time.perf_counter()
        try:
            fut = start(i)
        except Exception:  # noqa: BLE001 - counted
            with lock:
                errors[0] += 1
                active[0] -= 1
                if not active[0]:
                    idle.set()
            return
        fut.add_done_callback(lambda f: done(i, t0, f))

    def done(i: int, t0: float, fut: Future[Any]) -> None:
        ms = (time.perf_counter() - t0) * 1000
        with lock:
            if fut.exception() is None:
                samples.append(ms)
            else:
                errors[0] += 1
            if stop.is_set():
                active[0] -= 1
                if not active[0]:
                    idle.set()
                return
        launch(i)

    t_start = time.perf_counter()
    for i in range(n):
        launch(i)
    time.sleep(seconds)
    with lock:
        stop.set()
        counted = len(samples)
    elapsed = time.perf_counter() - t_start
    idle.wait(60)
    return counted, elapsed, samples[:counted], errors[0]
