"""`kwal bench recovery`: restart-to-serving time from a checkpoint + WAL, and WAL replay
speed beside raw confluent-kafka consuming the same WAL topic. One JSON line.

Steps: (1) the broker at cfg.bootstrap, or the embedded one (stopped at the end);
fresh topics under a unique prefix; Kafka WAL backend; a local-folder object store
in a temp dir; (2) load `rows` rows (default 1M) as large transactions (Parquet
objects attached as metadata-only entries) and take a checkpoint; (3) for each
N in `wal_entries` (default 10k, 100k): commit single-row transactions until N
WAL entries follow the checkpoint, stop the engine and the driver, then restart:
open a KafkaDriver (reads the WAL topic), recover (newest manifest, catalog and
block index from object storage, replay of the WAL after the manifest's LSN), and
serve one read and one commit -- `restart_s_<N>`; (4) in the same run, a raw
confluent-kafka consumer reads the whole WAL topic from the beginning.

Figures: `replay_eps_<N>` = entries replayed / (driver open - its fixed cost
`driver_open_empty_s`, measured on an empty topic in the same run, + replay
seconds) -- the driver also reads the pre-checkpoint records still in the topic
(the bench's drivers do not DeleteRecords, so the topic holds them on every broker);
`replay_apply_eps_<N>` = entries / seconds to decode and apply them;
`raw_eps_<N>` = entries in the topic / raw consume seconds; `replay_vs_raw` =
replay_eps / raw_eps at the largest N (target >= 0.5). `driver_open_cpu_s_<N>`,
`recover_cpu_s_<N>`, `recover_cpu_us_per_entry_<N>`: the process's CPU time in the
opening and in recovery (less sensitive to a shared machine's load than wall time).

(5) `restart_10x_vs_1x` (`restart_history`): restart time of a TN with ten times
the WAL history truncated behind its newest checkpoint over one with one times,
the same tail after it (target: about 1, <= 1.5).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from infra.config import KwalConfig
from ops.bench import restart_history
from ops.bench.report import emit, machine_loop_ms, ratio

DEFAULT_ROWS = 1_000_000
DEFAULT_ENTRIES = (10_000, 100_000)
DEFAULT_HISTORY = 2_000  # entries behind the checkpoint of the "1x" TN (step 5)
DEFAULT_TAIL = 500  # entries after it, both TNs
DEFAULT_ROUNDS = 5  # restarts of each (the figure is the median)
THREADS = 16
ATTACH_ROWS = 16 * 8192


def _raw_consume(cfg: KwalConfig, topic: str) -> tuple[float, int, int]:
    """Seconds, records and bytes to read the whole topic with a raw consumer."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        cfg.kafka_client(
            **{
                "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 50,
                "auto.offset.reset": "earliest",
            }
        )
    )
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        parts = sorted(md.partitions)
        ends = {}
        for p in parts:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            ends[p] = (lo, hi)
        t0 = time.perf_counter()
        c.assign([TopicPartition(topic, p, ends[p][0]) for p in parts])
        pending = {p for p in parts if ends[p][1] > ends[p][0]}
        records = nbytes = 0
        idle_since = time.perf_counter()
        while pending:
            msgs = c.consume(1000, 0.2)
            if not msgs:
                if time.perf_counter() - idle_since > 2.0:
                    break  # the high watermark may overstate the end (broker quirk)
                continue
            idle_since = time.perf_counter()
            for m in msgs:
                if m.error() is not None:
                    continue
                records += 1
                nbytes += len(m.value() or b"")
                part, off = m.partition(), m.offset()
                if part is not None and off is not None and off >= ends[part][1] - 1:
                    pending.discard(part)
        return time.perf_counter() - t0 - (2.0 if pending else 0.0), records, nbytes
    finally:
        c.close()


def _commit_singles(engine: Any, n: int, base: int) -> None:
    """n single-row transactions from THREADS threads (one WAL entry each)."""
    per = n // THREADS
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            k0 = base + i * per
            extra = n - per * THREADS if i == THREADS - 1 else 0
            for k in range(k0, k0 + per + extra):
                txn = engine.begin()
                txn.insert("bench", "t", [{"id": k, "v": "x"}])
                txn.commit().result(60)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def run(args: argparse.Namespace, cfg: KwalConfig) -> int:
    from infra.objectstore import FolderStore
    from ops.bench.kafka import bench_kafka
    from tn.checkpoint.compaction import attach_object
    from tn.checkpoint.dump import to_parquet
    from tn.checkpoint.recovery import Recovered, recover
    from tn.checkpoint.runner import CheckpointRunner
    from tn.engine import Engine
    from tn.logstore.driver import LogStore
    from tn.logstore.kafka_backend import KafkaDriver

    logging.getLogger("tn.logstore.kafka_backend").setLevel(logging.WARNING)
    rows = int(getattr(args, "rows", 0) or DEFAULT_ROWS)
    sizes = tuple(getattr(args, "wal_entries", None) or DEFAULT_ENTRIES)
    with bench_kafka(cfg, "recovery") as (cfg, where, _broker), tempfile.TemporaryDirectory(
        prefix="kwal-bench-recovery-"
    ) as tmpdir:
        cfg = dataclasses.replace(cfg, wal=dataclasses.replace(cfg.wal, backend="kafka"))
        store = FolderStore(Path(tmpdir) / "objects")
        result: dict[str, Any] = {
            "bench": "recovery",
            "machine_loop_ms_start": machine_loop_ms(),
            "backend": "kafka",
            "bootstrap": cfg.bootstrap,
            "embedded_broker": where == "embedded",
            "objectstore": "folder",
            "rows_checkpointed": rows,
            "wal_entries": list(sizes),
        }

        def open_log() -> tuple[LogStore, KafkaDriver]:
            d = KafkaDriver(cfg, delete_records=False, retention_policy="warn")
            return LogStore(d), d

        # the driver's fixed opening cost (epoch claim, fencing markers, producer's first
        # acknowledgements), measured on an empty WAL topic in the same run: the fastest
        # of three, the first of which also pays the process's first Kafka clients and
        # imports (it overstated the fixed cost, and so hid the reading of the topic)
        fixed = []
        for _ in range(3):
            empty = dataclasses.replace(
                cfg, topics=dataclasses.replace(cfg.topics, prefix=f"bench-{uuid.uuid4().hex[:8]}")
            )
            t0 = time.perf_counter()
            KafkaDriver(empty, delete_records=False, retention_policy="warn").close()
            fixed.append(time.perf_counter() - t0)
        open_fixed = min(fixed)
        result["driver_open_empty_s"] = round(open_fixed, 3)
        # (2) rows, checkpoint
        log, driver = open_log()
        result["truncation_mode"] = driver.truncation_mode
        engine = Engine(log)
        runner = CheckpointRunner(engine, store)
        txn = engine.begin()
        txn.create_database("bench")
        txn.create_table("bench", "t", [("id", "int64"), ("v", "string")], "id")
        txn.commit().result(30)
        t0 = time.perf_counter()
        for i, lo in enumerate(range(0, rows, ATTACH_ROWS)):
            hi = min(rows, lo + ATTACH_ROWS)
            ids = pa.array(range(lo, hi), pa.int64())
            store.put(
                f"uploads/{i}.parquet",
                to_parquet(pa.table({"id": ids, "v": pa.array(["r"] * (hi - lo))})),
            )
            attach_object(engine, store, "bench", "t", f"uploads/{i}.parquet")
        result["load_s"] = round(time.perf_counter() - t0, 3)
        m = runner.checkpoint()
        assert m is not None
        result["checkpoint_objects"] = len(m.objects)
        result["checkpoint_bytes"] = m.object_bytes
        done = 0
        next_key = rows + 1
        rec: Recovered | None = None
        for n in sizes:
            t0 = time.perf_counter()
            _commit_singles(engine, n - done, next_key)
            next_key += n - done
            result[f"commit_s_{n}"] = round(time.perf_counter() - t0, 3)
            done = n
            engine.close()
            log.close()
            # a restarting TN is a fresh process: the stopped engine's heap is released
            # before the clock starts (else the collector walks it during the restart --
            # the full collection after the driver's paused reading took up to half of
            # the opening under py-spy)
            del engine, runner, log, driver
            rec = None
            gc.collect()
            # (3) restart to serving
            t0 = time.perf_counter()
            c0 = time.process_time()
            log, driver = open_log()
            t_open = time.perf_counter() - t0
            c1 = time.process_time()
            rec = recover(log, store)
            c2 = time.process_time()
            engine = rec.engine
            got = engine.read("bench", "t").num_rows
            txn = engine.begin()
            txn.insert("bench", "t", [{"id": -next_key, "v": "probe"}])
            txn.commit().result(30)
            next_key += 1
            restart = time.perf_counter() - t0
            assert got == rows + n + (len(result.get("_probes", [])))
            result.setdefault("_probes", []).append(1)
            result[f"restart_s_{n}"] = round(restart, 3)
            result[f"driver_open_s_{n}"] = round(t_open, 3)
            result[f"load_checkpoint_s_{n}"] = round(rec.load_s, 3)
            result[f"replay_s_{n}"] = round(rec.replay_s, 3)
            # CPU seconds of this process (all its threads) while the driver opened and
            # while recovery ran: on a shared machine they swing far less with the load
            # than the wall times above
            result[f"driver_open_cpu_s_{n}"] = round(c1 - c0, 3)
            result[f"recover_cpu_s_{n}"] = round(c2 - c1, 3)
            result[f"recover_cpu_us_per_entry_{n}"] = round(1e6 * (c2 - c1) / max(rec.replayed, 1), 2)
            result[f"replayed_{n}"] = rec.replayed
            # reading the topic (driver open minus its fixed cost) + decoding and applying
            replay_eps = rec.replayed / (max(t_open - open_fixed, 0.0) + rec.replay_s)
            result[f"replay_apply_eps_{n}"] = round(rec.replayed / rec.replay_s)
            result[f"replay_eps_{n}"] = round(replay_eps)
            # (4) raw consume of the same topic, same run
            raw_s, records, nbytes = _raw_consume(cfg, cfg.topics.wal)
            entries_in_topic = log.next_lsn() - 1
            result[f"raw_records_{n}"] = records
            result[f"raw_s_{n}"] = round(raw_s, 3)
            raw_eps = entries_in_topic / raw_s if raw_s > 0 else 0.0
            result[f"raw_eps_{n}"] = round(raw_eps)
            result[f"replay_vs_raw_{n}"] = ratio(replay_eps, raw_eps)
            runner = rec.runner()  # keep the engine as a TN would (no checkpoint between N)
            runner.stop()
        result.pop("_probes", None)
        engine.close()
        log.close()
        # (5) restart time against the history truncated behind the checkpoint
        result.update(
            restart_history.measure(
                cfg,
                Path(tmpdir) / "history",
                int(getattr(args, "history", 0) or DEFAULT_HISTORY),
                int(getattr(args, "tail", 0) or DEFAULT_TAIL),
                rounds=int(getattr(args, "rounds", 0) or DEFAULT_ROUNDS),
            )
        )
        top = max(sizes)
        result["replay_vs_raw"] = result[f"replay_vs_raw_{top}"]
        result["target_met"] = result["replay_vs_raw"] >= 0.5
        emit(result)
        return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    p.add_argument("--wal-entries", type=int, nargs="+", default=list(DEFAULT_ENTRIES))
    p.add_argument("--history", type=int, default=DEFAULT_HISTORY)
    p.add_argument("--tail", type=int, default=DEFAULT_TAIL)
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    p.add_argument("--bootstrap")
    a = p.parse_args()
    cfg = KwalConfig.load()
    if a.bootstrap:
        cfg = cfg.with_bootstrap(a.bootstrap)
    return run(a, cfg)


if __name__ == "__main__":
    raise SystemExit(main())
