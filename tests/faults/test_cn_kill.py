"""Fault: a CN process killed with SIGKILL mid-stream and restarted. The restarted CN
catches up from the topics and agrees with the TN; nothing is duplicated or lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from infra.config import KwalConfig
from infra.topics import ensure_topics
from tn.engine import Engine
from tn.logstore.driver import LogStore
from tn.logstore.memory_backend import MemoryDriver
from tn.logtail.wiring import attach_logtail

CN_LOOP = """
import sys, time
from consumers.core.cn import CN
from infra.config import KwalConfig
cn = CN(KwalConfig.load(), ["db.t"]).start()
while True:
    print(cn.watermark(), flush=True)
    time.sleep(0.05)
"""


def test_cn_killed_and_restarted_agrees_with_tn(kwal_config: KwalConfig) -> None:
    cfg = kwal_config
    cfg.tn.heartbeat_ms = 20
    ensure_topics(cfg)
    env = {**os.environ, **cfg.to_env(), "KWAL_CONFIG": os.devnull}
    engine = Engine(LogStore(MemoryDriver()))
    logtail = attach_logtail(engine, cfg)
    child = None
    try:
        t = engine.begin()
        t.create_database("db")
        t.create_table("db", "t", [("id", "int64"), ("v", "string")], "id")
        t.commit().result(10)
        child = subprocess.Popen([sys.executable, "-c", CN_LOOP], env=env, stdout=subprocess.PIPE, text=True)
        stamps = []
        for i in range(200):
            t = engine.begin()
            t.insert("db", "t", [{"id": i, "v": "a"}])
            if i % 5 == 4:
                t.update("db", "t", [{"id": i - 2, "v": "b"}])
                t.delete("db", "t", [i - 4])
            stamps.append(t.commit().result(10))
            if i == 100:  # the CN has caught up with part of the stream: kill it
                assert child.stdout is not None
                deadline = time.monotonic() + 30
                while int(child.stdout.readline() or 0) < stamps[50] and time.monotonic() < deadline:
                    pass
                child.send_signal(signal.SIGKILL)
                child.wait(10)
        final = engine.heartbeat().result(10)
        assert logtail.publisher.flush(20)
        # the restarted CN: a new process, `kwal cn query`, from the topics
        for ts in (stamps[60], stamps[150], final):
            res = subprocess.run(
                [sys.executable, "-m", "ops.cli", "cn", "query", "--table", "db.t", "--ts", str(ts), "--json"],
                env=env, capture_output=True, text=True, timeout=120,
            )
            assert res.returncode == 0, res.stderr
            # rows come in storage order (`kwal cn query` streams them): compare by key
            got = sorted((json.loads(line) for line in res.stdout.splitlines()), key=lambda r: r["id"])
            assert got == engine.read("db", "t", ts).to_pylist(), ts
    finally:
        if child is not None and child.poll() is None:
            child.kill()
        logtail.close()
        engine.close()
