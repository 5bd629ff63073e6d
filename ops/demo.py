"""`kwal demo`: the end-to-end demo on a local stack (the README's main job).

1. start a local stack (loopback S3 + Apache Kafka, or tansu with `--broker tansu`)
   unless a Kafka is configured;
2. probe the broker (`kwal doctor`) and provision the topics;
3. start the TN as its own process (WAL on Kafka by default);
4. create a database and two tables through the producers client;
5. start a Python CN following both tables;
6. run several producer services at once, with conflicting updates on hot rows;
7. take a checkpoint (when the checkpoint module is present);
8. kill the TN with SIGKILL mid-load and restart it; the services keep going;
9. run the Spark CN (available-now) over the same logtail topics;
10. stop the TN, rebuild its state from the WAL, and check that both CNs agree
    with the TN at their watermarks; take a last checkpoint of the rebuilt state
    (it truncates the WAL); print a short report: among it the WAL as the broker
    holds it (log-start and end offsets per partition, segment bytes on disk) at the
    start, before and after that truncation, and the checkpoints taken;
11. stop everything it started.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.brokers.local import DEFAULT_BROKER
from infra.capabilities import probe
from infra.config import KwalConfig
from infra.stack import StackState, start_stack, stop_stack
from infra.topics import ensure_topics

if TYPE_CHECKING:
    from consumers.core.cn import CN

TABLES = {
    "shop.orders": ([("id", "int64"), ("customer", "string"), ("amount", "float64")], "id"),
    "shop.stock": ([("sku", "int64"), ("qty", "int64")], "sku"),
}
HOT_SKUS = 5
WAL_SEGMENT_MS = 2000


_STARTED = time.monotonic()


def say(msg: str) -> None:
    print(f"[demo {time.monotonic() - _STARTED:5.1f}s] {msg}", flush=True)


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    committed: int = 0
    conflicts: int = 0
    other_errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)

    def add(self, ok: bool, conflict: bool, ms: float) -> None:
        with self.lock:
            if ok:
                self.committed += 1
                self.latencies_ms.append(ms)
            elif conflict:
                self.conflicts += 1
            else:
                self.other_errors += 1


def _service(cfg: KwalConfig, name: str, first_id: int, count: int, tally: Tally, stop: threading.Event) -> None:
    """One producer service: orders inserts, each with a stock update on a hot sku."""
    from producers import Client, ConflictError, ProducerError

    rng = random.Random(name)
    with Client(cfg, name) as client:
        for i in range(count):
            if stop.is_set():
                return
            t = client.begin()
            sku = rng.randrange(HOT_SKUS)
            t.insert("shop.orders", [{"id": first_id + i, "customer": name, "amount": round(rng.uniform(1, 99), 2)}])
            t.update("shop.stock", [{"sku": sku, "qty": rng.randrange(1000)}])
            start = time.perf_counter()
            try:
                t.commit(timeout=60)
                tally.add(True, False, (time.perf_counter() - start) * 1000)
            except ConflictError:
                tally.add(False, True, 0)
            except ProducerError:
                tally.add(False, False, 0)


def _load(cfg: KwalConfig, services: int, per_service: int, first_id: int, tally: Tally) -> list[threading.Thread]:
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=_service,
            args=(cfg, f"svc{i}", first_id + i * per_service, per_service, tally, stop),
            daemon=True,
        )
        for i in range(services)
    ]
    for th in threads:
        th.start()
    return threads


def _own_stack(cfg: KwalConfig, broker: str) -> tuple[KwalConfig, StackState]:
    cfg.stack.state_dir = tempfile.mkdtemp(prefix="kwal-demo-")
    say(f"starting a local stack ({broker} broker, S3) in {cfg.stack.state_dir}")
    stack = start_stack(cfg, broker=broker)
    cfg = cfg.with_bootstrap(stack.broker_address)
    cfg.objectstore = stack.object_store
    return cfg, stack


def run(args: Any, cfg: KwalConfig) -> int:
    started = time.monotonic()
    stack: StackState | None = None
    if not cfg.bootstrap_explicit and not getattr(args, "bootstrap", None):
        cfg, stack = _own_stack(cfg, getattr(args, "broker", DEFAULT_BROKER))
    workdir = Path(tempfile.mkdtemp(prefix="kwal-demo-work-"))
    cfg = dataclasses.replace(
        cfg, topics=dataclasses.replace(cfg.topics, prefix=f"demo-{uuid.uuid4().hex[:6]}")
    )
    cfg.wal.backend = getattr(args, "wal", None) or "kafka"
    cfg.wal.dir = str(workdir / "wal")
    cfg.tn.heartbeat_ms = 20
    cfg.tn.checkpoint_interval_s = 3.0
    data_dir = Path(stack.broker_storage) if stack is not None and stack.broker == "kafka" else None
    try:
        report = _demo(args, cfg, workdir, data_dir)
        report["seconds"] = round(time.monotonic() - started, 1)
        say("report:")
        for k, v in report.items():
            print(f"  {k:<28} {v}", flush=True)
        return 0 if report.get("agree") else 1
    except Exception as e:  # noqa: BLE001 - the demo reports any failure in one line
        say(f"failed: {type(e).__name__}: {e}")
        return 1
    finally:
        if stack is not None:
            stopped = stop_stack(stack)
            say(f"stopped {', '.join(stopped)}; logs in {stack.log_dir}")
        shutil.rmtree(workdir, ignore_errors=True)


def wal_held(cfg: KwalConfig, data_dir: Path | None) -> tuple[str, int | None]:
    """The WAL as the broker holds it: per partition, log-start and end offsets, and the
    bytes of its segment files (where the broker is the demo's own Apache Kafka)."""
    from confluent_kafka.admin import AdminClient

    from infra.logsize import topic_size

    parts = topic_size(AdminClient(cfg.kafka_client()), cfg.topics.wal, data_dir)
    sizes = [p.bytes for p in parts if p.bytes is not None]
    total = sum(sizes) if len(sizes) == len(parts) else None
    offsets = " ".join(f"p{p.partition}: start {p.start} end {p.end}" for p in parts)
    return offsets + (f", {total} bytes on disk" if total is not None else ""), total


def _small_wal_segments(cfg: KwalConfig) -> None:
    """DeleteRecords moves a partition's log-start offset at once, but the broker frees
    disk only for whole segments below it: the demo rolls WAL segments every
    WAL_SEGMENT_MS so that the truncated prefix leaves the disk within seconds."""
    from confluent_kafka.admin import AdminClient

    from infra.topics import alter_topic_configs

    alter_topic_configs(
        AdminClient(cfg.kafka_client()), [cfg.topics.wal], {"segment.ms": WAL_SEGMENT_MS}
    )


def _wal_after_truncation(cfg: KwalConfig, data_dir: Path | None, before: int | None) -> str:
    """The WAL once the broker deleted the segments below the new log-start offset (it
    does at its next retention check); bounded wait, then as it is."""
    deadline = time.monotonic() + 15.0
    text, held = wal_held(cfg, data_dir)
    while before is not None and held is not None and held >= before:
        if time.monotonic() > deadline:
            return text + " (segments below the log start not deleted within 15 s)"
        time.sleep(0.5)
        text, held = wal_held(cfg, data_dir)
    return text


def _demo(args: Any, cfg: KwalConfig, workdir: Path, data_dir: Path | None = None) -> dict[str, Any]:
    from consumers.core.cn import CN
    from infra.objectstore import open_store
    from producers import Client
    from tn.service.process import TnProcess

    services = int(getattr(args, "services", 4) or 4)
    per_service = int(getattr(args, "transactions", 100) or 100)
    report: dict[str, Any] = {"kafka": cfg.bootstrap, "wal_backend": cfg.wal.backend}

    features = probe(cfg)
    missing = [n for n, p in features.items() if not p.works]
    say(f"Kafka at {cfg.bootstrap}; features missing: {', '.join(missing) or 'none'}")
    ensure_topics(cfg)

    tn = TnProcess(cfg, workdir)
    say("starting the TN")
    tn.start(timeout_s=120)
    cn: CN | None = None
    cns: dict[str, CN] = {}  # name -> a CN to compare with the TN
    try:
        with Client(cfg, "demo-admin") as admin:
            t = admin.begin()
            t.create_database("shop")
            for name, (columns, pk) in TABLES.items():
                t.create_table(name, columns, pk)
            t.commit(timeout=60)
            t = admin.begin()
            t.insert("shop.stock", [{"sku": s, "qty": 100} for s in range(HOT_SKUS)])
            t.commit(timeout=60)
        say(f"created {', '.join(TABLES)}")
        if data_dir is not None:
            _small_wal_segments(cfg)
        report["wal_at_start"] = wal_held(cfg, data_dir)[0]
        store = open_store(cfg.objectstore)
        cn = CN(cfg, list(TABLES), store).start()
        cns["CN"] = cn

        tally = Tally()
        say(f"{services} producer services x {per_service} transactions (hot rows: conflicts expected)")
        threads = _load(cfg, services, per_service, 0, tally)
        manifest = _wait_for_checkpoint(store, timeout_s=60)
        if manifest is not None:
            say(f"checkpoint at ts {manifest.ts}: WAL truncated through LSN {manifest.lsn}, "
                f"{len(manifest.objects)} objects in {cfg.objectstore.url}")
            report["checkpoint"] = f"ts {manifest.ts}, lsn {manifest.lsn}"
        say("SIGKILL the TN mid-load, then restart it")
        tn.kill()
        tn.start(timeout_s=120)
        for th in threads:
            th.join()
        report["services"] = services
        report["committed"] = tally.committed
        report["conflicts"] = tally.conflicts
        report["other_aborts_or_timeouts"] = tally.other_errors
        if tally.latencies_ms:
            lat = sorted(tally.latencies_ms)
            report["commit_p50_ms"] = round(lat[len(lat) // 2], 1)

        say("stopping the TN")
        tn.terminate()
        cn_mark = cn.watermark()
        late = CN(cfg, list(TABLES), store).start()
        cns["late CN"] = late
        if not late.wait_for(cn_mark, timeout_s=60):
            say(f"the late CN did not reach ts {cn_mark} (at {late.watermark()}): {late.errors}")
        say(f"a late CN bootstrapped from the checkpoint at ts {late.horizon} and caught up")
        report["late_cn_horizon"] = late.horizon
        spark_report = _spark_cn(cfg, workdir)
        report["wal_before_truncation"], held = wal_held(cfg, data_dir)
        engine_ok, details = _compare(cfg, cns, spark_report)
        report["wal_after_truncation"] = _wal_after_truncation(cfg, data_dir, held)
        from tn.checkpoint.manifest import list_manifests

        taken = list_manifests(store)
        report["checkpoints_taken"] = len(taken)
        report["checkpoint_lsns"] = " ".join(str(m.lsn) for m in taken)
        report.update(details)
        report["cn_watermark"] = cn_mark
        report["agree"] = engine_ok
        return report
    finally:
        for each in cns.values():
            each.close()
        tn.kill()


def _wait_for_checkpoint(store: Any, timeout_s: float) -> Any:
    """The first checkpoint manifest the TN writes (it checkpoints every few seconds here)."""
    from tn.checkpoint.manifest import newest_manifest

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        manifest = newest_manifest(store)
        if manifest is not None:
            return manifest
        time.sleep(0.5)
    say(f"no checkpoint within {timeout_s:.0f}s")
    return None


def _spark_cn(cfg: KwalConfig, workdir: Path) -> dict[str, Any] | None:
    """Run the Spark CN job as `kwal cn spark --trigger available-now` does (in this
    process) into Delta tables, then read each table back at its newest watermark as
    `kwal cn query --spark-output` does; None when Spark cannot start here (no Java)."""
    if shutil.which("java") is None and not Path(sys.prefix, "jre").exists():
        say("Spark CN skipped: no Java runtime on this machine")
        return None
    import argparse

    from consumers.spark.arguments import add_job_arguments
    from consumers.spark.delta_reader import table_as_of, user_rows
    from consumers.spark.jars import delta_jars
    from consumers.spark.job import run as run_job
    from consumers.spark.session import DELTA_CONF, build_session

    say("running the Spark CN (available-now; Spark takes a while to start)")
    output = str(workdir / "spark-out")
    parser = argparse.ArgumentParser()
    add_job_arguments(parser)
    # the TN truncates the logtail behind its checkpoints (physically on Apache Kafka): the
    # job starts from the newest checkpoint in the TN's object store when its topics no
    # longer start at offset 0 (--from-checkpoint auto)
    job_args = parser.parse_args(
        ["--tables", ",".join(TABLES), "--output", output, "--trigger", "available-now"]
    )
    code = run_job(job_args, cfg)
    if code != 0:
        raise RuntimeError(f"the Spark CN job ended with exit code {code}")
    spark = build_session("kwal-demo-cn", jars=delta_jars(), conf=DELTA_CONF)  # the job's
    try:
        tables = {}
        for name in TABLES:
            df, mark = table_as_of(spark, output, name, None)
            tables[name] = {"watermark": mark, "rows": user_rows(df)}
        return {"tables": tables}
    finally:
        spark.stop()


def _compare(
    cfg: KwalConfig, cns: dict[str, CN], spark: dict[str, Any] | None
) -> tuple[bool, dict[str, Any]]:
    """Rebuild the TN from its WAL and compare every CN at its watermark."""
    from tn.checkpoint.wiring import recover_from_config
    from tn.logstore.driver import LogStore
    from tn.service.main import open_driver

    log = LogStore(open_driver(cfg))
    rec = recover_from_config(log, cfg)
    engine = rec.engine
    details: dict[str, Any] = {}
    ok = True
    try:
        for name in TABLES:
            db, _, table = name.partition(".")
            for label, cn in cns.items():
                mark = cn.watermark(name)
                tn_rows = engine.read(db, table, mark).to_pylist()
                cn_rows = cn.snapshot(name, mark).to_pylist()
                same = tn_rows == cn_rows
                ok &= same
                details[f"{name} rows (TN={label})"] = (
                    f"{len(tn_rows)}={len(cn_rows)} {'agree' if same else 'DIFFER'}"
                )
            if spark is not None and name in spark.get("tables", {}):
                s = spark["tables"][name]
                # a table is a set of rows: the TN reads them in block order, the Delta
                # table in row id order (an update gets a new row id)
                pk = TABLES[name][1]
                tn_rows = sorted(engine.read(db, table, s["watermark"]).to_pylist(), key=lambda r: r[pk])
                same = tn_rows == sorted(s["rows"], key=lambda r: r[pk])
                ok &= same
                details[f"{name} spark"] = f"{len(s['rows'])} rows at {s['watermark']} {'agree' if same else 'DIFFER'}"
        # a last checkpoint of the rebuilt state truncates the WAL through its end
        runner = rec.runner()
        last = runner.checkpoint()
        runner.stop()
        if last is not None:
            say(f"final checkpoint at ts {last.ts}: WAL truncated through LSN {last.lsn} "
                f"({getattr(log.driver, 'truncation_mode', 'file WAL')})")
    finally:
        engine.close()
        log.close()
    if spark is None:
        details["spark_cn"] = "not run (no Java runtime here)"
    return ok, details


def main() -> int:  # pragma: no cover - `python -m ops.demo`
    from ops.cli import main as cli

    return cli(["demo", *sys.argv[1:]])
