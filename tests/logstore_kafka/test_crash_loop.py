"""A WAL writer killed with SIGKILL mid-load, over and over, on a real broker.

What is asserted (the replay guarantee of `tn.logstore.kafka_backend.replay`):

1. no acknowledged entry is lost: every restart recovers at least through the
   highest LSN any earlier writer acknowledged, and the final log holds, for
   every acknowledged LSN above the truncation point, exactly the payload of
   the writer that acknowledged it;
2. nothing unjustified is replayed: the log is gap-free from the truncation
   point; an entry written by writer k lies above k's own recovered base and
   at or below the base the next writer (k+1) recovered: entries k wrote but
   never had acknowledged are replayed only when they were part of the
   gap-free durable run k+1 adopted, never after it;
3. the truncation point only moves forward and survives every crash.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from infra.config import KwalConfig
from tn.logstore.driver import LogStore
from tn.logstore.kafka_backend import KafkaDriver

ROOT = Path(__file__).resolve().parents[2]
SLOW_CYCLES = int(os.environ.get("KWAL_CRASH_CYCLES", "20"))


def _run_child(
    bootstrap: str, prefix: str, index: int, load_s: float, early_kill_s: float | None = None
) -> list[str]:
    """Run one writer; SIGKILL it `load_s` after READY, or `early_kill_s` after spawn (during
    start-up: epoch claim, markers, replay, base record)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.logstore_kafka.crash_child", bootstrap, prefix, str(index)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.endswith("\n"):
                lines.append(line.strip())
                if line.startswith("READY"):
                    ready.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        if early_kill_s is not None:
            time.sleep(early_kill_s)
        else:
            assert ready.wait(60), f"child {index} never got ready: {lines[:3]}"
            time.sleep(load_s)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        t.join(10)
    return lines


# Four cycles (one kill during start-up) run in CI; the slow variant does twenty.
@pytest.mark.parametrize("cycles", [4, pytest.param(SLOW_CYCLES, marks=pytest.mark.slow)])
def test_sigkill_mid_load_loses_no_ack_and_replays_nothing_unjustified(
    wal_config: KwalConfig, cycles: int
) -> None:
    prefix = wal_config.topics.prefix
    acked_by: dict[int, int] = {}  # lsn -> child index
    base: dict[int, int] = {}  # child index -> recovered last LSN at its start
    max_acked = 0
    max_trunc = 0
    rng = random.Random(4)
    kills_in_startup = 0
    for k in range(cycles):
        # every fourth writer dies somewhere in its start-up (or just after)
        early = rng.uniform(0.8, 2.5) if k % 4 == 3 else None
        lines = _run_child(wal_config.bootstrap, prefix, k, load_s=1.0, early_kill_s=early)
        start = [ln for ln in lines if ln.startswith("START")]
        if early is not None and not start:
            kills_in_startup += 1
            continue  # killed before it recovered: it appended nothing
        assert start, f"child {k} printed no START: {lines[:5]}"
        last, truncated, _epoch = (int(x) for x in start[0].split()[1:])
        base[k] = last
        assert truncated >= max_trunc, "the truncation point moved back"
        assert last >= max_acked, f"child {k} recovered {last} < acknowledged {max_acked}"
        acks = [int(ln.split()[1]) for ln in lines if ln.startswith("ACK ")]
        assert all(lsn > last for lsn in acks)  # a writer appends above what it recovered
        for lsn in acks:
            acked_by[lsn] = k
        max_acked = max([max_acked, *acks])
        for ln in lines:
            if ln.startswith("TRUNC "):
                max_trunc = max(max_trunc, int(ln.split()[1]))
    assert max_acked > 0
    cfg = wal_config
    cfg.topics.wal_partitions = 2
    final = KafkaDriver(cfg, delete_records=False)
    try:
        t = final.truncated()
        assert t >= max_trunc
        got = {r.lsn: r.payload for r in LogStore(final).records()}
    finally:
        final.close()
    print(
        f"crash loop: {cycles} kills ({kills_in_startup} during start-up), "
        f"{len(acked_by)} acked, final log {t}+{len(got)}"
    )
    # 1. every acknowledged entry above the truncation point, with its payload
    for lsn, k in acked_by.items():
        if lsn > t:
            assert got[lsn].startswith(f"{k}:{lsn}:".encode()), (lsn, k, got.get(lsn))
    # 2. gap-free, and each entry inside its writer's justified range
    assert sorted(got) == list(range(t + 1, t + 1 + len(got)))
    for lsn, payload in got.items():
        k = int(payload.split(b":")[0])
        assert lsn > base[k], (lsn, k)
        later = [j for j in base if j > k]
        if later:  # the next writer that recovered adopted at most through its base
            nxt = base[min(later)]
            assert lsn <= nxt, f"LSN {lsn} of writer {k} replayed beyond the next base {nxt}"
