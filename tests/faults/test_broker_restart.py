"""Fault: the broker stopped and restarted under load (its data on the loopback S3
server, so it survives). The TN stalls while the broker is gone and resumes when it
is back; no acknowledged commit is lost and no aborted one is visible."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from infra.config import KwalConfig
from infra.processes import ServerProcess
from infra.topics import ensure_topics
from producers import Client, ProducerError
from producers import TimeoutError as ClientTimeout
from tests.conftest import unique
from tests.faults.broker import RestartableBroker
from tests.service.harness import recover_engine
from tn.service.process import TnProcess

COMMIT_TIMEOUT_S = 15  # well above the outage (3 s) and the TN's reconnect


def test_broker_restart_under_load_loses_no_acknowledged_commit(
    s3_server: ServerProcess, tmp_path: Path
) -> None:
    broker = RestartableBroker(s3_server)
    cfg = KwalConfig.load(environ={}).with_bootstrap(broker.address)
    cfg.topics.prefix = unique("kwal-")
    cfg.wal.backend = "kafka"
    cfg.wal.dir = str(tmp_path / "wal")
    # this run's own checkpoint store: the default folder may hold another WAL's checkpoints
    cfg.objectstore.url = f"file://{tmp_path / 'objects'}"
    ensure_topics(cfg)
    tn = TnProcess(cfg, tmp_path)
    tn.start(timeout_s=120)
    acked: set[int] = set()
    aborted: set[int] = set()
    unknown: set[int] = set()
    stop = threading.Event()
    lock = threading.Lock()
    try:
        with Client(cfg, "faults") as client:
            t = client.begin()
            t.create_database("f")
            t.create_table("f.t", [("id", "int64")], "id")
            t.commit(timeout=60)

            def load(worker: int) -> None:
                i = 0
                while not stop.is_set():
                    key = worker * 1_000_000 + i
                    i += 1
                    try:
                        # A bounded wait: the embedded broker, restarted, can lose a record it
                        # acknowledged (a request or a result); that commit's outcome is then
                        # unknown to its client, which goes on with the next one.
                        client.begin().insert("f.t", [{"id": key}]).commit(timeout=COMMIT_TIMEOUT_S)
                        outcome = acked
                    except ProducerError as e:
                        outcome = unknown if isinstance(e, ClientTimeout) else aborted
                    with lock:
                        outcome.add(key)

            threads = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(4)]
            for th in threads:
                th.start()
            time.sleep(1.5)
            with lock:
                before_outage = len(acked)
            broker.stop()
            time.sleep(3)  # the TN stalls: appends wait, nothing is acknowledged
            broker.restart()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with lock:
                    if len(acked) > before_outage + 50:
                        break
                time.sleep(0.2)
            stop.set()
            for th in threads:
                th.join(timeout=90)
        with lock:
            assert len(acked) > before_outage + 50, "the TN did not resume after the broker came back"
        tn.terminate()
        engine, log = recover_engine(cfg)
        try:
            present = set(engine.read("f", "t").column("id").to_pylist())
        finally:
            engine.close()
            log.close()
        assert acked <= present, sorted(acked - present)[:10]
        assert not (aborted & present), sorted(aborted & present)[:10]
    finally:
        tn.kill()
        broker.stop()
