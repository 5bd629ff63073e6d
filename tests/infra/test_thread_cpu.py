"""`infra.processes.threads_cpu_s`: the CPU of a process's threads picked by name (the
bench's JIT figure for the broker's compiler threads)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from infra.processes import process_cpu_s, threads_cpu_s

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux /proc")


def test_threads_cpu_counts_only_the_threads_named() -> None:
    pid = os.getpid()
    with open(f"/proc/{pid}/task/{pid}/comm") as f:
        main_name = f.read().strip()
    before = threads_cpu_s(pid, (main_name,))
    assert before is not None
    deadline = time.monotonic() + 30
    while threads_cpu_s(pid, (main_name,)) == before:  # spin until a clock tick is charged
        assert time.monotonic() < deadline, "no CPU charged to the main thread in 30 s"
        sum(range(10_000))
    mine = threads_cpu_s(pid, (main_name,))
    whole = process_cpu_s(pid)
    assert mine is not None and whole is not None
    assert before < mine <= whole
    assert threads_cpu_s(pid, ("no thread is named so",)) == 0.0


def test_threads_cpu_of_a_process_that_is_not_there_is_none() -> None:
    assert threads_cpu_s(2**22 + 12345, ("x",)) is None
