"""`infra.processes.ThreadsCpuMeter`: the CPU of a process's threads picked by name (the
bench's JIT figure for the broker's compiler threads), counted per thread so that a thread
ending between two readings never makes the figure go down."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

import pytest

from infra.processes import ThreadsCpuMeter, process_cpu_s

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux /proc")

PR_SET_NAME = 15  # prctl: this thread's `comm`


def _thread_ticks(tid: int) -> int:
    with open(f"/proc/{os.getpid()}/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class _Burner(threading.Thread):
    """A thread named `name` in /proc that uses `ticks` clock ticks of CPU, then waits for
    `release` before it ends."""

    def __init__(self, name: bytes, ticks: int) -> None:
        super().__init__(daemon=True)
        self.comm, self.ticks = name, ticks
        self.burnt, self.release = threading.Event(), threading.Event()
        self.used = self.tid = 0

    def run(self) -> None:
        ctypes.CDLL(None).prctl(PR_SET_NAME, self.comm, 0, 0, 0)
        self.tid = tid = threading.get_native_id()
        deadline = time.monotonic() + 30
        while _thread_ticks(tid) < self.ticks and time.monotonic() < deadline:
            sum(range(10_000))
        self.used = _thread_ticks(tid)
        self.burnt.set()
        self.release.wait(30)


def _burn(name: bytes, ticks: int) -> _Burner:
    burner = _Burner(name, ticks)
    burner.start()
    assert burner.burnt.wait(30) and burner.used >= ticks, "the thread was charged no CPU in 30 s"
    return burner


def test_counts_only_the_threads_named() -> None:
    pid = os.getpid()
    with open(f"/proc/{pid}/task/{pid}/comm") as f:
        main_name = f.read().strip()
    meter = ThreadsCpuMeter(pid, (main_name,))
    before = meter.read()
    assert before is not None
    deadline = time.monotonic() + 30
    while meter.read() == before:  # spin until a clock tick is charged
        assert time.monotonic() < deadline, "no CPU charged to the main thread in 30 s"
        sum(range(10_000))
    mine, whole = meter.read(), process_cpu_s(pid)
    assert mine is not None and whole is not None
    assert before < mine <= whole
    assert ThreadsCpuMeter(pid, ("no thread is named so",)).read() == 0.0


def test_a_thread_that_ends_between_readings_keeps_what_was_seen_and_a_new_one_counts_whole() -> None:
    hz = os.sysconf("SC_CLK_TCK")
    meter = ThreadsCpuMeter(os.getpid(), ("kwal-burn",))
    assert meter.read() == 0.0
    first = _burn(b"kwal-burn-1", 3)
    seen = meter.read()
    assert seen is not None and seen >= first.used / hz
    first.release.set()
    first.join(30)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{os.getpid()}/task/{first.tid}"):  # the OS thread is gone too
        assert time.monotonic() < deadline, "the ended thread stayed in /proc for 30 s"
        time.sleep(0.01)
    # a sum over the threads alive now would be 0 here: the figure would go down (the
    # bench's negative JIT CPU); per thread, what the earlier reading saw stays
    ended = meter.read()
    assert ended is not None and ended >= seen
    second = _burn(b"kwal-burn-2", 2)
    try:
        after = meter.read()
        assert after is not None and after - ended >= second.used / hz  # all of it: started since
    finally:
        second.release.set()
        second.join(30)


def test_a_process_that_is_not_there_reads_none() -> None:
    assert ThreadsCpuMeter(2**22 + 12345, ("x",)).read() is None
