"""SIGKILL a process in the middle of group commits, many times; after each
kill, every acknowledged entry is back, intact and in order, and the log goes on.

SIGKILL leaves the page cache whole, so half of the kills are followed by a
simulated power loss: the newest segment is cut at a random byte after the
last acknowledged entry (unsynced data only), and recovery must cut the torn
tail without losing an acknowledged entry.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tn.logstore.driver import LogStore
from tn.logstore.file_backend import FileDriver
from tn.logstore.file_backend.format import decode_lsn
from tn.logstore.file_backend.reader import LogReader, Record

from .helpers import crash_size, payload, truncate_file

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("crash_child.py")
KILLS = 22


def _spawn(directory: Path, seed: int) -> subprocess.Popen[bytes]:
    """Start a child; it imports, then waits for a line on stdin."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(directory), str(seed)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )


def _run_and_kill(
    proc: subprocess.Popen[bytes], delay: float, on_ready: Callable[[], None]
) -> tuple[int, list[int], list[int]]:
    """Let the child go, kill it `delay` s after READY (calling `on_ready` there);
    return (its recovered last LSN, the LSNs it reported completed, the
    truncation points it reported)."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    ready = proc.stdout.readline().decode()
    assert ready.startswith("READY "), ready + proc.stderr.read().decode()
    lines: list[bytes] = []
    stdout = proc.stdout
    drain = threading.Thread(target=lambda: lines.extend(iter(stdout.readline, b"")))
    drain.start()
    started = time.monotonic()
    on_ready()
    time.sleep(max(0.0, delay - (time.monotonic() - started)))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    drain.join(timeout=10)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        pipe.close()
    done = [int(x) for x in lines if x.endswith(b"\n") and not x.startswith(b"T")]
    points = [int(x.split()[1]) for x in lines if x.endswith(b"\n") and x.startswith(b"T")]
    return int(ready.split()[1]), done, points


def _tear_unacknowledged_tail(directory: Path, acked: int, rng: random.Random) -> bool:
    """Power loss after SIGKILL: cut the newest segment at a random byte past the
    last acknowledged entry (only unsynced data may be lost). True if it cut."""
    segments = sorted(directory.glob("*.log"))
    if not segments:
        return False
    path = segments[-1]
    with open(path, "rb") as f:
        ends = [
            (decode_lsn(r.data), r.end) for r in LogReader(f, str(path)) if isinstance(r, Record)
        ]
    if not ends or ends[-1][0] <= acked:
        return False
    acked_end = max((end for lsn, end in ends if lsn <= acked), default=0)
    truncate_file(path, rng.randrange(acked_end, ends[-1][1]))
    return True


def test_sigkill_loses_only_unacknowledged_entries(tmp_path: Path) -> None:
    directory = tmp_path / "wal"
    rng = random.Random(20261122)
    last = 0
    truncated = 0
    total_acked = 0
    tears = 0
    children = [_spawn(directory, 0)]

    def spawn_next(seed: int) -> Callable[[], None]:
        return lambda: children.append(_spawn(directory, seed))

    try:
        for i in range(KILLS):
            # The next child imports while this one runs (it waits for its "go").
            delay = rng.uniform(0.02, 0.2)
            ready, done, points = _run_and_kill(children[-1], delay, spawn_next(i + 1))
            assert ready == last  # the child recovered what the parent saw
            assert done == sorted(done) and (not done or done[0] == last + 1)
            total_acked += len(done)
            if rng.random() < 0.5:
                tears += _tear_unacknowledged_tail(directory, max(done, default=last), rng)
            driver = FileDriver(directory)
            try:
                truncated = driver.truncated()
                assert truncated >= max(points, default=0)
                records = list(LogStore(driver).records())
                lsns = [r.lsn for r in records]
                assert lsns == list(range(truncated + 1, driver.last_lsn() + 1))  # contiguous
                for r in records:
                    assert r.payload == payload(r.lsn, crash_size(r.lsn)), f"entry {r.lsn} damaged"
                if done:
                    assert driver.last_lsn() >= done[-1]  # every acknowledged entry survived
                assert driver.last_lsn() >= last
                last = driver.last_lsn()
            finally:
                driver.close()
    finally:
        children[-1].kill()
        children[-1].communicate()
    assert total_acked >= 50  # the children did get work acknowledged
    assert tears > 0  # some recoveries had a torn tail to cut
    driver = FileDriver(directory, recovery_mode="absolute-consistency")
    try:
        assert LogStore(driver).append(b"after").result(timeout=10) == last + 1
        assert driver.read(last + 1, 100)[0][0].payload == b"after"
    finally:
        driver.close()
