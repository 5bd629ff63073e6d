"""The `kwal` command line (argparse).

Arguments are declared here, in one place; each command's work lives in the
module named beside it, imported only when that command runs (so `kwal
doctor` never pays for importing Spark). Every command module exposes
`run(args, cfg) -> int` (the exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from consumers.spark.arguments import add_job_arguments
from infra.brokers.local import BROKERS, DEFAULT_BROKER
from infra.config import ConfigError, KwalConfig
from infra.stack import apply_stack
from ops.install import add_arguments as add_install_arguments


def _positive_int(text: str) -> int:
    """argparse type: an integer of at least 1 (a count of clients, transactions ...)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not at least 1")
    return n


def _command(sub: argparse._SubParsersAction, name: str, target: str, help: str) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help, description=help)
    parser.set_defaults(target=target)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kwal", description="A transactional log platform on Kafka.")
    parser.add_argument("--config", help="TOML config file (default: $KWAL_CONFIG or ./kwal.toml)")
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (overrides the config)")
    sub = parser.add_subparsers(dest="command", required=True)

    doctor = _command(sub, "doctor", "ops.doctor:run", "probe which Kafka features the broker really has")
    doctor.add_argument("--json", action="store_true", help="print JSON instead of a table")
    doctor.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the broker")

    demo = _command(sub, "demo", "ops.demo:run", "run the end-to-end demo on a local stack")
    demo.add_argument("--broker", choices=BROKERS, default=DEFAULT_BROKER,
                      help="the broker the demo starts (Apache Kafka, or the embedded tansu)")
    demo.add_argument("--wal", choices=["kafka", "file"], default="kafka", help="the TN's log backend")
    demo.add_argument("--services", type=int, default=4, help="producer services running at once")
    demo.add_argument("--transactions", type=int, default=100, help="transactions per service")

    install = _command(sub, "install", "ops.install:run",
                       "resolve the JVM components (Apache Kafka, Spark's connectors and Delta "
                       "Lake, Apicurio Registry) from Maven Central into the cache now")
    add_install_arguments(install)

    up = _command(sub, "up", "infra.stack:run_up", "start a local stack (broker + S3) in the background")
    up.add_argument("--broker", choices=BROKERS, default=DEFAULT_BROKER,
                    help="Apache Kafka (installed from Maven Central on first use) or the embedded tansu")
    up.add_argument("--broker-storage", choices=["memory", "s3"], default="memory",
                    help="where tansu keeps its data (Apache Kafka keeps it on local disk)")
    up.add_argument("--secure", action="store_true",
                    help="Apache Kafka with SASL/SCRAM over TLS and kwal's ACLs; writes one config "
                    "file per principal (docs/security.md)")
    up.add_argument("--brokers", type=int, choices=[1, 3], default=1,
                    help="Apache Kafka nodes: 3 starts a KRaft cluster whose kwal topics are "
                    "replicated 3 times, 2 in sync (docs/cluster.md)")
    _command(sub, "down", "infra.stack:run_down", "stop what `kwal up` started")
    _command(sub, "status", "infra.stack:run_status", "show the local stack's processes and addresses")

    wal = sub.add_parser("wal", help="inspect a write-ahead log").add_subparsers(dest="wal_command", required=True)
    dump = _command(wal, "dump", "tn.logstore.dump:run", "print the entries of a file-backend WAL")
    dump.add_argument("path", help="the WAL directory")
    dump.add_argument("--json", action="store_true", help="one JSON object per entry")
    dump.add_argument("--recovery-mode", default="point-in-time")

    bench = sub.add_parser("bench", help="benchmarks (one JSON line each)").add_subparsers(
        dest="bench_command", required=True
    )
    bwal = _command(bench, "wal", "ops.bench.wal_{backend}:run", "WAL append throughput and latency")
    bwal.add_argument("--backend", choices=["file", "kafka"], default="file")
    bwal.add_argument("--entries", type=int, default=0, help="entries per run (0 = the bench's default)")
    bcommit = _command(bench, "commit", "ops.bench.commit:run", "TN commit throughput vs Kafka transactions")
    bcommit.add_argument("--seconds", type=float, default=5.0, help="seconds per client count")
    bcommit.add_argument("--saturated-seconds", type=float, default=60.0,
                         help="length of the saturated 1-row phase (TN RSS sampled over it)")
    bcommit.add_argument("--saturated-only", action="store_true",
                         help="only raw Kafka and the saturated phases (profiling runs)")
    bcommit.add_argument("--only-1000row", action="store_true",
                         help="with --saturated-only: skip the saturated 1-row phase (profile the 1,000-row one)")
    bcommit.add_argument("--big-inflight", type=_positive_int, default=16,
                         help="1,000-row transactions in flight in all (over up to 4 clients)")

    blog = _command(bench, "logtail", "ops.bench.logtail:run", "commit-to-visible latency at a CN")
    blog.add_argument("--seconds", type=float, default=5.0, help="seconds per target rate")
    blog.add_argument("--apply-txns", type=int, default=2000, help="100-row txns for the apply rate")

    brec = _command(bench, "recovery", "ops.bench.recovery:run", "restart-to-serving after a checkpoint")
    brec.add_argument("--rows", type=int, default=1_000_000, help="rows checkpointed")
    brec.add_argument("--wal-entries", type=int, nargs="+", default=[10_000, 100_000],
                      help="WAL entries after the checkpoint, one run each")
    brec.add_argument("--history", type=int, default=2_000,
                      help="WAL entries truncated behind the 1x TN's checkpoint (10x: ten times)")
    brec.add_argument("--tail", type=int, default=500,
                      help="WAL entries after both TNs' checkpoints (restart_10x_vs_1x)")
    brec.add_argument("--rounds", type=int, default=5,
                      help="restarts of each TN for restart_10x_vs_1x (median)")

    bscale = _command(bench, "scale", "ops.bench.scale:run", "TN memory and rows/s over a long history")
    bscale.add_argument("--rows", type=int, default=8_000_000, help="rows committed")
    bscale.add_argument("--txn-rows", type=int, default=1000, help="rows per transaction")
    bscale.add_argument("--clients", type=int, default=4, help="committing threads")
    bscale.add_argument("--hot-keys", type=int, default=50_000,
                        help="updates/deletes pick among each thread's last this many keys")
    bscale.add_argument("--checkpoint-s", type=float, default=15.0, help="seconds between checkpoints")
    bscale.add_argument("--slope-from", type=int, default=0,
                        help="rows from which the RSS slope is fitted (0: 1M, or rows/4 if fewer)")
    bscale.add_argument("--diag", action="store_true",
                        help="add what the TN holds at each checkpoint (diags)")
    bscale.add_argument("--kafka-seconds", type=float, default=10.0, help="seconds of raw Kafka")

    bspark = _command(bench, "spark", "ops.bench.spark:run", "Spark CN rows/s vs raw decode")
    bspark.add_argument("--rows", type=int, default=200_000)
    bspark.add_argument("--rows-per-txn", type=int, default=10)
    bspark.add_argument("--latency-samples", type=int, default=8)
    bspark.add_argument("--warmups", type=int, default=None,
                        help="warm-up queries before the measured one (default: until the "
                        "JVM's CPU per query is steady, ops.bench.spark.WARMUP_QUERIES)")

    bcnread = _command(bench, "cn-read", "ops.bench.cn_read:run",
                       "a CN's peak memory while it streams a whole table larger than its cache")
    bcnread.add_argument("--rows", type=int, default=8_000_000, help="rows loaded into the table")

    ckpt = sub.add_parser("checkpoint", help="checkpoints").add_subparsers(dest="ckpt_command", required=True)
    now = _command(ckpt, "now", "tn.checkpoint.commands:run_now", "take a checkpoint now (TN stopped)")
    now.add_argument("--json", action="store_true")
    lst = _command(ckpt, "list", "tn.checkpoint.commands:run_list", "list checkpoints: ts, LSN, objects, bytes")
    lst.add_argument("--json", action="store_true")

    tn = sub.add_parser("tn", help="the transaction node").add_subparsers(dest="tn_command", required=True)
    _command(tn, "run", "tn.service.main:run", "run the TN: consume requests, commit, publish results")
    cn = sub.add_parser("cn", help="compute nodes").add_subparsers(dest="cn_command", required=True)
    cspark = _command(cn, "spark", "consumers.spark.job:run", "the Spark Structured Streaming CN")
    add_job_arguments(cspark)
    tail = _command(cn, "tail", "consumers.core.commands:run_tail", "print a table's changes live")
    tail.add_argument("--table", required=True, help="db.table")
    tail.add_argument("--seconds", type=float, default=0, help="stop after this long (0 = never)")
    tail.add_argument("--heartbeats", action="store_true", help="print heartbeats too")
    query = _command(cn, "query", "consumers.core.commands:run_query", "print a table's snapshot")
    query.add_argument("--table", required=True, help="db.table")
    query.add_argument("--ts", type=int, default=0, help="as of this ts (default: the watermark)")
    query.add_argument("--timeout", type=float, default=30.0, help="seconds to wait to catch up")
    query.add_argument("--json", action="store_true", help="one JSON object per row")
    query.add_argument("--spark-output", help="answer from the Spark CN's Delta tables at this "
                       "path (local or s3a://) instead of the topics")
    changes = sub.add_parser("changes", help="the standard change stream per table").add_subparsers(
        dest="changes_command", required=True
    )
    crun = _command(
        changes, "run", "consumers.cdc.command:run",
        "follow the logtail, publish Debezium-style change events (docs/change-stream.md)",
    )
    crun.add_argument("--table", action="append", help="db.table (repeat; default: the config's)")
    crun.add_argument("--seconds", type=float, default=0, help="stop after this long (0 = never)")
    ops = sub.add_parser("ops", help="operate the log: status, truncation, retention")
    ops_sub = ops.add_subparsers(dest="ops_command", required=True)
    ostatus = _command(
        ops_sub, "status", "ops.status:run",
        "one screen: WAL, truncation, window, checkpoint, CN lag, retention",
    )
    ostatus.add_argument("--json", action="store_true", help="print JSON for tools")
    ostatus.add_argument(
        "--no-probe", action="store_true", help="skip the DeleteRecords probe (mode: unknown)"
    )
    ostatus.add_argument("--timeout", type=float, default=10.0, help="seconds per Kafka wait")
    otrunc = _command(
        ops_sub, "truncate", "ops.truncate:run",
        "truncate the WAL to the last checkpoint's LSN now",
    )
    otrunc.add_argument(
        "--logical-only", action="store_true", help="record the point only, no DeleteRecords"
    )
    otrunc.add_argument("--timeout", type=float, default=10.0, help="seconds per Kafka wait")
    ocompact = _command(
        ops_sub, "compact", "ops.compact:run",
        "run the TN's compaction policy now (merge small or tombstoned blocks)",
    )
    ocompact.add_argument("--table", help="db.table (default: every table)")
    ocompact.add_argument("--json", action="store_true", help="print JSON for tools")
    ocompact.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the TN")
    oacl = _command(
        ops_sub, "acl", "ops.acl:run",
        "secure mode: create kwal's Kafka ACLs (apply) or report drift from them (check)",
    )
    oacl.add_argument("action", choices=["apply", "check"])
    oacl.add_argument("--timeout", type=float, default=15.0, help="seconds per Kafka wait")
    oret = _command(
        ops_sub, "retention", "ops.retention:run",
        "check or set retention of the WAL and logtail topics",
    )
    oret.add_argument(
        "--check", action="store_true", help="exit 1 when a current setting is unsafe (default)"
    )
    oret.add_argument("--set", metavar="ms=N,bytes=N", help="set retention, only if safe now")
    oret.add_argument("--set-ms", type=int, help="set retention.ms, only if safe now")
    oret.add_argument("--set-bytes", type=int, help="set retention.bytes, only if safe now")
    oret.add_argument("--timeout", type=float, default=10.0, help="seconds per Kafka wait")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = KwalConfig.load(args.config)
    except ConfigError as e:
        print(f"kwal: {e}", file=sys.stderr)
        return 2
    if args.bootstrap:
        cfg = cfg.with_bootstrap(args.bootstrap)
    cfg = apply_stack(cfg, explicit_bootstrap=bool(args.bootstrap) or cfg.bootstrap_explicit)
    module_name, _, func = args.target.format(**vars(args)).partition(":")
    run = getattr(importlib.import_module(module_name), func)
    try:
        return int(run(args, cfg))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
