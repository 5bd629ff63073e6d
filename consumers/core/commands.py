"""`kwal cn tail` and `kwal cn query`: a CN on the command line."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from consumers.core.cn import CN
from consumers.core.exceptions import CNError
from infra.config import KwalConfig
from infra.kafka_io import poll_batch
from infra.objectstore import open_store
from schemas.arrow_ipc import ipc_to_table
from schemas.logtail import BlockMeta, Changes, Checkpoint, Heartbeat, LogtailRecord, decode_logtail


def describe(record: LogtailRecord) -> list[str]:
    """Human lines for one logtail record."""
    head = f"ts={record.commit_ts} lsn={record.lsn}"
    body = record.body
    if isinstance(body, Changes):
        lines = []
        if body.inserts is not None:
            for row in ipc_to_table(body.inserts).to_pylist():
                lines.append(f"{head} insert {row}")
        if body.deletes is not None:
            for row in ipc_to_table(body.deletes).to_pylist():
                lines.append(f"{head} delete {row}")
        return lines
    if isinstance(body, Heartbeat):
        return [f"{head} heartbeat"]
    if isinstance(body, BlockMeta):
        return [f"{head} block {body.block_id} flushed to {body.meta_loc} (drop before {body.drop_before_ts})"]
    if isinstance(body, Checkpoint):
        return [f"{head} checkpoint {body.manifest_key}"]
    return [f"{head} {body!r}"]


def run_tail(args: Any, cfg: KwalConfig) -> int:
    database, _, table = args.table.partition(".")
    if not table:
        print(f"kwal cn tail: --table must be db.table, got {args.table!r}", file=sys.stderr)
        return 2
    consumer = Consumer(cfg.kafka_client(**{"group.id": f"{cfg.topics.prefix}.tail",
                                            "enable.auto.commit": False, "fetch.wait.max.ms": 50,
                                            "isolation.level": "read_committed",
                                            # a truncated start: from the first record kept
                                            "auto.offset.reset": "earliest"}))
    consumer.assign([TopicPartition(cfg.topics.logtail(database, table), 0, 0)])
    show_heartbeats = bool(getattr(args, "heartbeats", False))
    deadline = time.monotonic() + args.seconds if args.seconds else None
    try:
        while deadline is None or time.monotonic() < deadline:
            for m in poll_batch(consumer, 100, 0.2):
                if m.error() is not None:
                    continue
                record = decode_logtail(m.value() or b"")
                if isinstance(record.body, Heartbeat) and not show_heartbeats:
                    continue
                for line in describe(record):
                    print(line, flush=True)
    finally:
        consumer.close()
    return 0


def run_query(args: Any, cfg: KwalConfig) -> int:
    """The table as of `--ts`, or, without it, as of the watermark the CN reaches once it
    has read everything its topics held at the start (`CN.catch_up`). With
    `--spark-output PATH`: from the Spark CN's Delta tables there instead.

    The rows are written as they are read (`CN.scan`: batch by batch, in storage order,
    not sorted), so a table larger than memory can be queried; the CN stops following its
    topics before the read (the scan needs only the object store and what it holds)."""
    if getattr(args, "spark_output", None):
        from consumers.spark.delta_reader import run_query as delta_query

        return delta_query(args, cfg)
    store = open_store(cfg.objectstore)
    cn = CN(cfg, [args.table], store).start()
    ts: int | None = args.ts or None
    try:
        try:
            if ts is None:
                reached = cn.catch_up(args.timeout)
                target = "the end of its topics"
            else:
                reached = cn.wait_for(ts, args.table, timeout_s=args.timeout)
                target = f"ts {ts}"
            if not reached:
                print(f"kwal cn query: {args.table} did not reach {target} within {args.timeout}s "
                      f"(watermark {cn.watermark(args.table)})", file=sys.stderr)
                return 1
            scan = cn.scan(args.table, ts)
        finally:
            cn.close()
        as_json = bool(getattr(args, "json", False))
        for batch in scan:
            lines = [json.dumps(row, default=str) if as_json else str(row) for row in batch.to_pylist()]
            sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
    except (CNError, KafkaException, OSError) as e:
        print(f"kwal cn query: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"({scan.rows} rows as of ts {scan.ts})", file=sys.stderr)
    return 0
