"""`restart_10x_vs_1x` for `kwal bench recovery`: a TN's restart does not grow with the
WAL history truncated behind its newest checkpoint.

Two TNs on topics of their own (same broker, same run), numbered as `measure` runs:

1. each commits its history (TN "1x": `history` single-row transactions, TN "10x":
   ten times as many) and takes a checkpoint, which truncates its WAL (physically
   where the broker has DeleteRecords; either way the truncation record names the
   offsets a starting writer reads from);
2. each commits the same tail (`tail` single-row transactions) after it;
3. both restart `rounds` times, alternately (1x, 10x, 1x, ...): close, open the
   driver, recover (newest checkpoint + the WAL after it), serve one read and one
   commit. Each restart's probe commit adds one entry to both tails alike.

Figures: `restart_s_1x` / `restart_s_10x` (medians), `restart_10x_vs_1x` (their
ratio: about 1 when replay starts at the truncation point, about 10x the
history's share when it reads from offset 0), and the WAL records each restart
read (`restart_records_read_*`: the tail's records and markers, not the history).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from infra.config import KwalConfig


def _commit(engine: Any, first: int, n: int) -> None:
    """n single-row transactions (one WAL entry each), a few in flight at once."""
    pending = []
    for k in range(first, first + n):
        txn = engine.begin()
        txn.insert("bench", "h", [{"id": k, "v": "x"}])
        pending.append(txn.commit())
        if len(pending) >= 64:
            for f in pending:
                f.result(60)
            pending.clear()
    for f in pending:
        f.result(60)


class _Tn:
    """One TN: its own topics and object store; opened, closed and restarted."""

    def __init__(self, cfg: KwalConfig, name: str, objects: Path, deletes: bool) -> None:
        from infra.objectstore import FolderStore

        prefix = f"{cfg.topics.prefix}-{name}-{uuid.uuid4().hex[:6]}"
        self.cfg = dataclasses.replace(cfg, topics=dataclasses.replace(cfg.topics, prefix=prefix))
        self.store = FolderStore(objects / name)
        self.deletes = deletes
        self.engine: Any = None
        self.log: Any = None
        self.driver: Any = None
        self.next_key = 1

    def _open_log(self) -> None:
        from tn.logstore.driver import LogStore
        from tn.logstore.kafka_backend import KafkaDriver

        self.driver = KafkaDriver(self.cfg, delete_records=self.deletes, retention_policy="warn")
        self.log = LogStore(self.driver)

    def load(self, history: int, tail: int) -> int:
        """Steps 1-2; returns the checkpoint's LSN."""
        from tn.checkpoint.runner import CheckpointRunner
        from tn.engine import Engine

        self._open_log()
        self.engine = Engine(self.log)
        txn = self.engine.begin()
        txn.create_database("bench")
        txn.create_table("bench", "h", [("id", "int64"), ("v", "string")], "id")
        txn.commit().result(30)
        runner = CheckpointRunner(self.engine, self.store)
        _commit(self.engine, self.next_key, history)
        self.next_key += history
        m = runner.checkpoint()
        runner.stop()
        assert m is not None and self.log.truncated() == m.lsn
        _commit(self.engine, self.next_key, tail)
        self.next_key += tail
        return m.lsn

    def restart(self) -> tuple[float, int]:
        """Step 3 once: (seconds to serving, WAL records the driver read)."""
        from tn.checkpoint.recovery import recover

        self.close()
        t0 = time.perf_counter()
        self._open_log()
        rec = recover(self.log, self.store)
        self.engine = rec.engine
        self.engine.read("bench", "h")
        txn = self.engine.begin()
        txn.insert("bench", "h", [{"id": -self.next_key, "v": "probe"}])
        txn.commit().result(30)
        elapsed = time.perf_counter() - t0
        self.next_key += 1
        return elapsed, int(self.driver.records_read)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        if self.log is not None:
            self.log.close()
            self.log = None


def measure(
    cfg: KwalConfig, objects: Path, history: int, tail: int, rounds: int = 5
) -> dict[str, Any]:
    """Steps 1-3 (module docstring); the figures for the bench's JSON line."""
    from infra.capabilities import deletes_records

    deletes = deletes_records(cfg, "WAL")
    tns = {"1x": _Tn(cfg, "h1x", objects, deletes), "10x": _Tn(cfg, "h10x", objects, deletes)}
    out: dict[str, Any] = {"history_entries": history, "tail_entries": tail, "restarts": rounds}
    try:
        for name, tn in tns.items():
            out[f"checkpoint_lsn_{name}"] = tn.load(history * (10 if name == "10x" else 1), tail)
        times: dict[str, list[float]] = {name: [] for name in tns}
        for _ in range(rounds):
            for name, tn in tns.items():
                seconds, read = tn.restart()
                times[name].append(seconds)
                out[f"restart_records_read_{name}"] = read
    finally:
        for tn in tns.values():
            tn.close()
    one, ten = statistics.median(times["1x"]), statistics.median(times["10x"])
    out["restart_s_1x"] = round(one, 3)
    out["restart_s_10x"] = round(ten, 3)
    out["restart_10x_vs_1x"] = round(ten / one, 3) if one > 0 else None
    out["restart_truncation"] = "physical" if deletes else "logical"
    return out
