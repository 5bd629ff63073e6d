"""Fault: split brain. A TN frozen with SIGSTOP while a second TN takes its WAL over, then
resumed with SIGCONT, must never get a commit acknowledged that the second TN does not
have, nor publish anything a reader takes as truth (issue 26, docs/fencing.md).

Each round: clients keep many commits in flight against the serving TN (A); A is frozen;
a new TN (B) starts and takes over; A is resumed either DURING B's takeover (once B's log
says it claimed its epoch, before B is ready) or AFTER B is ready, alternately; A must
then exit with FENCED_EXIT and B serves the next round. A Python CN follows the logtail
throughout. At the end, with every request answered:

- every commit a client saw acknowledged (by either TN) is in the state of a TN rebuilt
  from checkpoint + WAL, at exactly the acknowledged commit ts, and visible in a snapshot
  at that ts; nothing else is visible (no aborted, no unacknowledged request);
- no request has two different outcomes on the results topic (read_committed);
- the CN equals the durable state at its watermark.

A round that resumes A during B's takeover holds B in its recovery (`_Hold`) until A,
resumed, has met the fence and exited.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import defaultdict
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from consumers.core.cn import CN
from infra.config import KwalConfig
from infra.objectstore import open_store
from infra.topics import ensure_topics
from producers import Client, CommitResult, ProducerError
from schemas.requests import decode_results
from tests.service.harness import recover_engine
from tests.waiting import wait_until
from tn.service.main import FENCED_EXIT
from tn.service.process import TnProcess

DB, TABLE = "sb", "t"
NAME = f"{DB}.{TABLE}"
WORKERS, IN_FLIGHT = 4, 16
CLAIMED = b"claimed by writer"  # B's log line once its epoch is claimed (after the fence)


@dataclass
class Outcomes:
    """What the clients saw, per row id (one row per request)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    acked: dict[int, int] = field(default_factory=dict)  # id -> acknowledged commit ts
    refused: dict[int, str] = field(default_factory=dict)  # id -> why (an aborted answer)
    futures: list[Future[CommitResult]] = field(default_factory=list)
    next_id: int = 0

    def settle(self, row: int, fut: Future[CommitResult]) -> None:
        try:
            res = fut.result(timeout=0)
        except ProducerError as e:
            with self.lock:
                self.refused[row] = str(e)
            return
        with self.lock:
            self.acked[row] = res.commit_ts


def _load(client: Client, out: Outcomes, stop: threading.Event) -> None:
    window: list[Future[CommitResult]] = []
    while not stop.is_set():
        window = [f for f in window if not f.done()]
        if len(window) >= IN_FLIGHT:
            # the window is full: wait for a commit to finish (bounded, to see `stop`)
            wait(window, timeout=0.1, return_when=FIRST_COMPLETED)
            continue
        with out.lock:
            row = out.next_id
            out.next_id += 1
        fut = client.begin().insert(NAME, [{"id": row, "v": f"v{row}"}]).commit_async()
        fut.add_done_callback(lambda f, row=row: out.settle(row, f))
        with out.lock:
            out.futures.append(fut)
        window.append(fut)


def _acks(out: Outcomes) -> int:
    with out.lock:
        return len(out.acked)


def _start_async(tn: TnProcess) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            tn.start(timeout_s=120)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    t = threading.Thread(target=run, name="start-tn")
    t.start()
    return t, errors


def _log_of(tn: TnProcess) -> Path:
    return tn.workdir / f"tn-{tn.starts}.log"


class _Hold:
    """Holds a starting TN inside its recovery, between its epoch claim and its readiness:
    an open Kafka transaction on the results topic pins the topic's last stable offset, so
    the TN's results scan (read_committed, step "On start" of `TnService`) cannot reach
    the end until the transaction is aborted. Real Kafka, no hook in the TN."""

    def __init__(self, cfg: KwalConfig) -> None:
        self._p = Producer(
            cfg.kafka_client(**{"transactional.id": f"{cfg.topics.prefix}.hold", "acks": "all"})
        )
        self._p.init_transactions(30)
        self._p.begin_transaction()
        self._p.produce(cfg.topics.results, b"hold")
        assert self._p.flush(30) == 0

    def release(self) -> None:
        self._p.abort_transaction(30)


def _round(cfg: KwalConfig, a: TnProcess, workdir: Path, r: int, out: Outcomes) -> TnProcess:
    """One round: freeze A under load, B takes over, A resumed during or after it."""
    during = r % 2 == 0
    t0 = time.monotonic()
    before = _acks(out)
    wait_until(f"round {r}: commits under way on A", lambda: _acks(out) >= before + 50, 60)
    assert a.proc is not None
    proc = a.proc
    os.kill(proc.pid, signal.SIGSTOP)
    t1 = time.monotonic()
    workdir.mkdir()
    hold = _Hold(cfg) if during else None
    b = TnProcess(cfg, workdir)
    starting, errors = _start_async(b)
    try:
        if hold is not None:
            # resume A between B's epoch claim (after its fence) and B's readiness
            wait_until(
                f"round {r}: B claims its epoch",
                lambda: b.proc is not None and CLAIMED in _log_of(b).read_bytes(),
                120,
            )
            assert b"kwal-tn ready" not in _log_of(b).read_bytes(), f"round {r}: B was ready"
            os.kill(proc.pid, signal.SIGCONT)
            wait_until(f"round {r}: the resumed TN exits", lambda: proc.poll() is not None, 60)
            hold.release()
        starting.join(150)
        assert not starting.is_alive() and not errors, f"round {r}: B did not start: {errors}"
        t2 = time.monotonic()
        if hold is None:
            os.kill(proc.pid, signal.SIGCONT)
        # the resumed A is fenced (at its next commit, or by the meta topic) and exits
        wait_until(f"round {r}: the resumed TN exits", lambda: proc.poll() is not None, 60)
        log = _log_of(a).read_text(errors="replace")
        assert proc.returncode == FENCED_EXIT, f"round {r}: A exited {proc.returncode}:\n{log[-3000:]}"
        assert "fenced" in log
        a.proc = None
        t3 = time.monotonic()
        print(
            f"round {r} ({'during' if during else 'after'}): load {t1 - t0:.1f}s, "
            f"B ready {t2 - t1:.1f}s, A exits {t3 - t2:.1f}s"
        )
        return b
    except BaseException:
        if hold is not None:
            hold.release()
        starting.join(150)
        b.kill()
        raise


def _results(cfg: KwalConfig) -> dict[str, set[tuple[bool, int, str]]]:
    """request id -> the distinct outcomes on the results topic (read_committed)."""
    topic = cfg.topics.results
    c = Consumer(
        cfg.kafka_client(
            **{
                "group.id": f"{cfg.topics.prefix}.check",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
    )
    out: dict[str, set[tuple[bool, int, str]]] = defaultdict(set)
    try:
        _, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 60
        while c.position([TopicPartition(topic, 0)])[0].offset < high:
            assert time.monotonic() < deadline, "reading the results topic did not end"
            for m in c.consume(1000, 0.2):
                if m.error() is None:
                    for res in decode_results(m.value() or b""):
                        kind = "" if res.committed else f"{res.kind.value}/{res.reason}"
                        out[res.request_id].add(
                            (res.committed, res.commit_ts if res.committed else 0, kind)
                        )
    finally:
        c.close()
    return out


def _durable_cts(engine: Any) -> dict[int, int]:
    """id -> the commit ts of its row in the engine (the per-row MVCC stamp)."""
    t, schema = engine._table_at(DB, TABLE, engine.now())
    pk = next(c.column_id for c in schema.columns if c.name == schema.primary_key)
    out: dict[int, int] = {}
    for blk, n in t.mem.block_rows():
        mem = blk.mem
        for i, key in enumerate(mem.cols[pk][:n]):
            if mem.dts[i] > engine.now():
                out[int(key)] = int(mem.cts[i])
    return out


@pytest.mark.parametrize("rounds", [10, pytest.param(30, marks=pytest.mark.slow)])
def test_a_frozen_tn_resumed_never_acknowledges_a_lost_commit(
    kwal_config: KwalConfig, tmp_path: Path, rounds: int
) -> None:
    cfg = kwal_config
    cfg.wal.backend = "kafka"
    cfg.wal.fence = "transactions"
    cfg.tn.checkpoint_interval_s = 3.0  # the rebuilt TN starts from a checkpoint
    ensure_topics(cfg)
    out = Outcomes()
    tn = TnProcess(cfg, tmp_path / "tn0")
    (tmp_path / "tn0").mkdir()
    client = Client(cfg, "split-brain")
    stop = threading.Event()
    threads: list[threading.Thread] = []
    cn: CN | None = None
    try:
        tn.start(timeout_s=120)
        client.begin().create_database(DB).create_table(
            NAME, [("id", "int64"), ("v", "string")], "id"
        ).commit(timeout=60)
        cn = CN(cfg, [NAME], open_store(cfg.objectstore)).start()
        threads = [
            threading.Thread(target=_load, args=(client, out, stop), name=f"load-{w}")
            for w in range(WORKERS)
        ]
        for t in threads:
            t.start()
        for r in range(rounds):
            tn = _round(cfg, tn, tmp_path / f"tn{r + 1}", r, out)
        last = _acks(out)
        wait_until("commits on the last TN", lambda: _acks(out) >= last + 50, 60)
        stop.set()
        for t in threads:
            t.join(10)
        # every request gets its answer: from A before its freeze, or from the TN that
        # took over (it answers every request after the durable position truthfully)
        deadline = time.monotonic() + 60
        for fut in list(out.futures):
            fut.exception(timeout=max(0.1, deadline - time.monotonic()))
        wait_until(
            "outcomes recorded", lambda: len(out.acked) + len(out.refused) == out.next_id, 10
        )
        assert not out.refused, f"requests refused: {list(out.refused.items())[:5]}"
        assert cn.catch_up(60), "the CN did not catch up"
        assert tn.terminate() == 0
        _check(cfg, out, cn, rounds)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        tn.kill()
        client.close()
        if cn is not None:
            cn.close()


def _check(cfg: KwalConfig, out: Outcomes, cn: CN, rounds: int) -> None:
    """The end-of-test checks (module docstring), with every TN stopped."""
    results = _results(cfg)
    twice = {rid: o for rid, o in results.items() if len(o) > 1}
    assert not twice, f"requests with two outcomes on the results topic: {list(twice.items())[:5]}"

    engine, log = recover_engine(cfg)  # checkpoint + WAL
    try:
        durable = _durable_cts(engine)
        acked = dict(out.acked)
        lost = sorted(set(acked) - set(durable))
        assert not lost, f"{len(lost)} acknowledged commits lost, e.g. {lost[:10]}"
        extra = sorted(set(durable) - set(acked))
        assert not extra, f"{len(extra)} rows visible that no client saw acknowledged: {extra[:10]}"
        wrong_ts = {k: (ts, durable[k]) for k, ts in acked.items() if durable[k] != ts}
        assert not wrong_ts, f"acknowledged ts != durable ts: {list(wrong_ts.items())[:10]}"
        # visible in a snapshot at its acknowledged ts (a spread of the ts, ends included)
        stamps = sorted(set(acked.values()))
        step = max(1, len(stamps) // 40)
        for ts in [*stamps[::step], stamps[-1]]:
            at = set(engine.read(DB, TABLE, ts).column("id").to_pylist())
            due = {k for k, t in acked.items() if t <= ts}
            assert due <= at, f"acknowledged at or before {ts}, not visible at it: {sorted(due - at)[:10]}"
            assert at <= set(acked), f"visible at {ts}, never acknowledged: {sorted(at - set(acked))[:10]}"
        # the CN equals the durable state at its watermark
        wm = cn.watermark(NAME)
        assert wm >= max(stamps), f"the CN's watermark {wm} is behind the last ack {max(stamps)}"
        got = cn.snapshot(NAME, wm).sort_by("id").to_pylist()
        want = engine.read(DB, TABLE, wm).to_pylist()
        assert got == want, (
            f"CN at {wm} differs: {len(got)} rows vs {len(want)} durable; missing "
            f"{sorted({r['id'] for r in want} - {r['id'] for r in got})[:10]}"
        )
        print(f"{rounds} rounds: {len(acked)} acknowledged commits, {len(results)} results")
    finally:
        engine.close()
        log.close()
