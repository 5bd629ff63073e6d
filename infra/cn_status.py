"""CN status records on the ops topic (`<prefix>.ops`): how a CN that keeps no Kafka
consumer group (the Spark CN: Spark keeps its offsets in its checkpoint location) tells
`kwal ops status` its watermark and lag.

A record is JSON, keyed `cn-status/<name>`::

    {"kind": "cn_status", "id": "<name>", "cn": "spark", "name": "<name>",
     "watermark": <ts>, "tables": {"db.t": <ts>, ...}, "batch_id": <n>,
     "rows": <input rows of the batch>, "ts_ms": <when sent>}

1. the CN publishes one after each micro-batch (`publish_status`; the Spark CN from a
   StreamingQueryListener, `consumers.spark.status`);
2. `kwal ops status` (ops.status) reads the topic's last `TAIL` records (`read_statuses`) and keeps the
   newest record per name: the watermark lag is *now* minus the watermark's physical
   time, so a CN that stopped reporting shows a growing lag (and its report's age).

The TN's ops listener skips these records (`infra.control.decode`: not a command).
"""

from __future__ import annotations

import json
import time
from typing import Any

from confluent_kafka import Consumer, Message, Producer, TopicPartition

from infra.config import KwalConfig
from infra.topic_scan import read_to_end

KIND = "cn_status"
TAIL = 5000  # records of the ops topic read back (statuses and commands)
STALE_S = 60.0  # a report older than this is shown as stale
LOGICAL_BITS = 16  # a ts is `physical_ms << 16 | logical` (schemas/FORMAT.md 1)


def status_record(
    name: str, cn: str, tables: dict[str, int], batch_id: int, rows: int
) -> dict[str, Any]:
    return {
        "kind": KIND,
        "id": name,
        "cn": cn,
        "name": name,
        "watermark": min(tables.values()) if tables else 0,
        "tables": tables,
        "batch_id": batch_id,
        "rows": rows,
        "ts_ms": int(time.time() * 1000),
    }


def publish_status(producer: Producer, cfg: KwalConfig, record: dict[str, Any]) -> None:
    """Step 1 (asynchronous: the producer's poll or flush delivers it)."""
    producer.produce(
        cfg.topics.ops,
        json.dumps(record, sort_keys=True).encode(),
        key=f"cn-status/{record['name']}".encode(),
        partition=0,
    )
    producer.poll(0)


def read_statuses(cfg: KwalConfig, timeout_s: float) -> list[dict[str, Any]]:
    """Step 2: the newest status of each CN among the ops topic's last TAIL records, with
    `lag_s` (now - watermark), `age_s` (since it was sent) and `stale`."""
    probe = Consumer(cfg.kafka_client(**{"group.id": "kwal-ops-cn-status"}))
    try:
        low, high = probe.get_watermark_offsets(TopicPartition(cfg.topics.ops, 0), timeout=timeout_s)
    finally:
        probe.close()
    newest: dict[str, dict[str, Any]] = {}

    def on_msg(msg: Message) -> None:
        try:
            doc = json.loads(msg.value() or b"")
        except ValueError:
            return
        if isinstance(doc, dict) and doc.get("kind") == KIND and isinstance(doc.get("name"), str):
            old = newest.get(doc["name"])
            if old is None or int(doc.get("ts_ms", 0)) >= int(old.get("ts_ms", 0)):
                newest[doc["name"]] = doc

    if high > low:
        read_to_end(cfg, cfg.topics.ops, [0], on_msg, timeout_s, start={0: max(low, high - TAIL)})
    now_ms = time.time() * 1000
    out = []
    for name in sorted(newest):
        doc = dict(newest[name])
        mark = int(doc.get("watermark", 0))
        doc["lag_s"] = round(max(0.0, now_ms - (mark >> LOGICAL_BITS)) / 1000, 1) if mark else None
        doc["age_s"] = round(max(0.0, now_ms - int(doc.get("ts_ms", 0))) / 1000, 1)
        doc["stale"] = doc["age_s"] > STALE_S
        out.append(doc)
    return out

