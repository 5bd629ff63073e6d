"""Fault: the broker stopped and restarted under load (its data on the loopback S3
server, so it survives). The TN stalls while the broker is gone and resumes when it
is back; when it is gone longer than the append timeout (or librdkafka declares the
WAL producer fatal after the restart) the TN reopens its log. Either way no
acknowledged commit is lost and no aborted one is visible."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from infra.config import KwalConfig
from infra.processes import ServerProcess
from infra.topics import ensure_topics
from producers import Client, ProducerError
from producers import TimeoutError as ClientTimeout
from tests.conftest import unique
from tests.faults.broker import RestartableBroker
from tests.service.harness import recover_engine
from tests.waiting import wait_until
from tn.service.process import TnProcess

COMMIT_TIMEOUT_S = 15  # well above the outage (3 s) and the TN's reconnect


@dataclass
class Outcomes:
    acked: set[int]
    aborted: set[int]
    before_outage: int
    tn_log: str
    same_process: bool


def _load_through_an_outage(
    cfg: KwalConfig, broker: RestartableBroker, tmp_path: Path, outage_s: float
) -> Outcomes:
    """Run 4 committing clients against a TN, stop the broker for `outage_s`, restart it,
    wait (up to 60 s) for 50 more acknowledged commits, stop the TN; then check, on an
    engine recovered from the log, that every acknowledged commit is there and no aborted
    one is."""
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
            def acks() -> int:
                with lock:
                    return len(acked)

            wait_until("20 commits acknowledged before the outage", lambda: acks() >= 20)
            before_outage = acks()
            broker.stop()
            time.sleep(outage_s)  # the outage itself: the broker stays away this long
            broker.restart()
            try:
                # bounded by the TN's reconnect or log reopening plus the clients' commit
                # timeout for the requests the outage swallowed (COMMIT_TIMEOUT_S), with room
                # for a loaded machine
                wait_until("50 more commits acknowledged after the broker came back",
                           lambda: acks() > before_outage + 50, timeout_s=120)
            except AssertionError as e:
                log_tail = (tmp_path / "tn-1.log").read_text(errors="replace")[-4000:]
                raise AssertionError(f"{e}; acknowledged: {acks()}; the TN's log:\n{log_tail}") from e
            stop.set()
            for th in threads:
                th.join(timeout=90)
        assert tn.proc is not None
        same_process = tn.proc.poll() is None and tn.starts == 1
        tn.terminate()
        engine, log = recover_engine(cfg)
        try:
            present = set(engine.read("f", "t").column("id").to_pylist())
        finally:
            engine.close()
            log.close()
        with lock:
            assert acked <= present, sorted(acked - present)[:10]
            assert not (aborted & present), sorted(aborted & present)[:10]
            return Outcomes(
                set(acked),
                set(aborted),
                before_outage,
                (tmp_path / "tn-1.log").read_text(errors="replace"),
                same_process,
            )
    finally:
        tn.kill()
        broker.stop()


def test_broker_restart_under_load_loses_no_acknowledged_commit(
    s3_server: ServerProcess, tmp_path: Path
) -> None:
    """A short outage (3 s, below wal.append_timeout_s): the TN stalls and resumes."""
    broker = RestartableBroker(s3_server)
    cfg = KwalConfig.load(environ={}).with_bootstrap(broker.address)
    cfg.topics.prefix = unique("kwal-")
    out = _load_through_an_outage(cfg, broker, tmp_path, outage_s=3)
    assert len(out.acked) > out.before_outage + 50, "the TN did not resume after the broker came back"


def test_broker_away_past_the_append_timeout_tn_reopens_its_log(
    s3_server: ServerProcess, tmp_path: Path
) -> None:
    """An outage longer than wal.append_timeout_s fails the WAL writer (an append is
    pending through it), and with it the engine. The TN process does not stop serving for good: it reopens its log on a new
    epoch (retrying while the broker is away), recovers, answers the requests whose commits
    failed from what the log holds, and takes commits again. No acknowledged commit is
    lost, no commit answered as aborted is visible."""
    broker = RestartableBroker(s3_server)
    cfg = KwalConfig.load(environ={}).with_bootstrap(broker.address)
    cfg.topics.prefix = unique("kwal-")
    cfg.wal.append_timeout_s = 2.0
    # Clients cannot send requests while the broker is away, so the TN's own writes are
    # what meet the outage: a checkpoint every 2 s logs its catalog updates.
    cfg.tn.checkpoint_interval_s = 2.0
    out = _load_through_an_outage(cfg, broker, tmp_path, outage_s=6)
    assert "reopening it" in out.tn_log, out.tn_log[-3000:]
    assert out.same_process, "the TN process exited instead of reopening its log"
    assert len(out.acked) > out.before_outage + 50, "the TN did not resume after reopening its log"
