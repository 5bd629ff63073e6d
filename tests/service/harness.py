"""Kill -9 harness: the TN as a subprocess under load, killed and restarted.

    report = crash_cycles(cfg, workdir, cycles=3)   # raises AssertionError on a violation

Each cycle: start `python -m tn.service.main` (on the log backend its config
names: the callers set `cfg.wal.backend`), drive load from an in-process `producers.Client` (that
client lives across TN restarts), SIGKILL the TN while transactions are in
flight, then — with the TN dead — recover the WAL in this process and check
that every commit acknowledged so far is present. At the end the TN is
restarted once more, every outstanding request must get its answer (the
restarted TN resumes the requests topic where it left off), the TN is stopped
with SIGTERM, and the recovered state must equal the model exactly:

- every key whose insert was acknowledged committed is present, with its value;
- no key whose request was answered aborted, or never answered, is present;
- each hot key (updated concurrently, so some updates conflict) holds the
  value of its committed update with the highest commit ts.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.config import KwalConfig
from infra.topics import ensure_topics
from producers import Client, CommitResult, ConflictError, ProducerError
from tn.service.process import TnProcess

DB, TABLE = "crash", "t"
HOT_KEYS = 4


def recover_engine(cfg: KwalConfig) -> tuple[Any, Any]:
    """Recover the TN's state in this process as the TN does (the TN must be dead): its
    newest checkpoint (the TN may have taken one in the background), then the WAL."""
    from infra.objectstore import open_store
    from tn.checkpoint.recovery import recover
    from tn.logstore.driver import LogStore
    from tn.service.main import open_driver

    log = LogStore(open_driver(cfg))
    return recover(log, open_store(cfg.objectstore)).engine, log


@dataclass
class Model:
    lock: threading.Lock = field(default_factory=threading.Lock)
    inserted: dict[int, str] = field(default_factory=dict)  # acknowledged commits
    aborted: set[int] = field(default_factory=set)
    hot: dict[int, tuple[int, str]] = field(default_factory=dict)  # key -> (commit ts, value)
    pending: dict[str, tuple[Future[CommitResult], str, int, str]] = field(default_factory=dict)
    sent: int = 0
    conflicts: int = 0

    def settle(self, fut: Future[CommitResult], kind: str, key: int, value: str) -> None:
        try:
            res = fut.result(timeout=0)
        except ConflictError:
            with self.lock:
                self.conflicts += 1
                if kind == "insert":
                    self.aborted.add(key)
            return
        except ProducerError:
            with self.lock:
                if kind == "insert":
                    self.aborted.add(key)
            return
        with self.lock:
            if kind == "insert":
                self.inserted[key] = value
            elif res.commit_ts > self.hot.get(key, (0, ""))[0]:
                self.hot[key] = (res.commit_ts, value)


@dataclass
class CrashReport:
    cycles: int
    sent: int
    committed: int
    aborted: int
    conflicts: int
    rows: int


def _settle(model: Model, kind: str, key: int, value: str, fut: Future[CommitResult]) -> None:
    model.settle(fut, kind, key, value)


def _load(
    client: Client, model: Model, stop: threading.Event, worker: int, counter: list[int]
) -> None:
    rng = random.Random(worker)
    window: list[Future[CommitResult]] = []
    while not stop.is_set():
        with model.lock:
            counter[0] += 1
            seq = counter[0]
            model.sent += 1
        txn = client.begin()
        if rng.random() < 0.2:
            kind, key, value = "hot", rng.randrange(HOT_KEYS), f"w{worker}-{seq}"
            txn.update(f"{DB}.{TABLE}", [{"id": key, "v": value}])
        else:
            kind, key, value = "insert", 1000 + seq, f"w{worker}-{seq}"
            txn.insert(f"{DB}.{TABLE}", [{"id": key, "v": value}])
        fut = txn.commit_async()
        fut.add_done_callback(functools.partial(_settle, model, kind, key, value))
        window.append(fut)
        window = [f for f in window if not f.done()]
        while len(window) >= 8 and not stop.is_set():
            time.sleep(0.002)
            window = [f for f in window if not f.done()]


def crash_cycles(
    cfg: KwalConfig,
    workdir: Path,
    cycles: int = 3,
    workers: int = 4,
    load_s: tuple[float, float] = (0.5, 1.5),
    seed: int = 0,
) -> CrashReport:
    workdir.mkdir(parents=True, exist_ok=True)
    ensure_topics(cfg)
    rng = random.Random(seed)
    tn = TnProcess(cfg, workdir)
    model = Model()
    counter = [0]
    client = Client(cfg)
    all_futures: list[Future[CommitResult]] = []
    try:
        tn.start()
        setup = client.begin()
        setup.create_database(DB)
        setup.create_table(f"{DB}.{TABLE}", [("id", "int64"), ("v", "string")], "id")
        setup.insert(f"{DB}.{TABLE}", [{"id": k, "v": "init"} for k in range(HOT_KEYS)])
        setup.commit(timeout=60)

        orig_send = client._send

        def tracking_send(req: Any) -> Future[CommitResult]:
            fut = orig_send(req)
            all_futures.append(fut)
            return fut

        client._send = tracking_send  # type: ignore[method-assign]

        for cycle in range(cycles):
            if cycle:
                tn.start()
            stop = threading.Event()
            threads = [
                threading.Thread(target=_load, args=(client, model, stop, w + cycle * 100, counter))
                for w in range(workers)
            ]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(*load_s))
            tn.kill()  # SIGKILL mid-stream: requests in flight, commits queued
            stop.set()
            for t in threads:
                t.join()
            # with the TN dead: every commit acknowledged so far is in the WAL
            with model.lock:
                acked = dict(model.inserted)
            engine, log = recover_engine(cfg)
            try:
                rows = {r["id"]: r["v"] for r in engine.read(DB, TABLE).to_pylist()}
            finally:
                engine.close()
                log.close()
            missing = [k for k in acked if rows.get(k) != acked[k]]
            assert not missing, (
                f"cycle {cycle}: acknowledged commits missing after kill -9: {missing[:10]}"
            )

        # last restart: everything outstanding gets answered, then a clean stop
        tn.start()
        deadline = time.monotonic() + 60
        for fut in all_futures:
            fut.exception(timeout=max(0.1, deadline - time.monotonic()))
        time.sleep(0.2)  # done-callbacks of the last futures
        assert tn.terminate() == 0
        engine, log = recover_engine(cfg)
        try:
            state = {r["id"]: r["v"] for r in engine.read(DB, TABLE).to_pylist()}
        finally:
            engine.close()
            log.close()
        with model.lock:
            expected = dict(model.inserted)
            for k in range(HOT_KEYS):
                expected[k] = model.hot.get(k, (0, "init"))[1]
            assert not (set(state) & model.aborted), "an aborted transaction is visible"
            assert state == expected, (
                f"state differs from the model: extra {sorted(set(state) - set(expected))[:10]}, "
                f"missing {sorted(set(expected) - set(state))[:10]}, "
                f"different {[k for k in expected if k in state and state[k] != expected[k]][:10]}"
            )
            return CrashReport(
                cycles,
                model.sent,
                len(model.inserted) + len(model.hot),
                len(model.aborted),
                model.conflicts,
                len(state),
            )
    finally:
        tn.kill()
        client.close()
