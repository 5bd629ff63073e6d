"""Operator commands to the running TN over the ops topic (`<prefix>.ops`), and replies.

Why a topic: an ops command must never open the WAL itself (a `KafkaDriver` claims a
new epoch and fences the running TN). The TN listens on the ops topic
(tn.service.ops_listener) from its end at start; a command sent while no TN runs is
never answered, and the caller says so when its wait ends.

Records are JSON, keyed by the command id:

    command {"kind": "command", "id": ID, "op": "compact", "args": {"table": "db.t"}}
    reply   {"kind": "reply",   "id": ID, "ok": true, "result": {...}}  (or "error": "...")

1. `send_command` notes the topic's end, produces the command (acks=all), then reads the
   topic from its own record's offset until the reply with its id (bounded wait);
2. the TN answers every command it reads, in order, once.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from infra.config import KwalConfig
from infra.exceptions import OpsError
from infra.kafka_io import IDLE_FETCH_WAIT_MS, poll_batch

COMMAND, REPLY = "command", "reply"


@dataclass(frozen=True)
class Command:
    id: str
    op: str
    args: dict[str, Any]


def encode_command(cmd: Command) -> bytes:
    return json.dumps({"kind": COMMAND, "id": cmd.id, "op": cmd.op, "args": cmd.args}).encode()


def encode_reply(command_id: str, result: Any = None, error: str = "") -> bytes:
    doc: dict[str, Any] = {"kind": REPLY, "id": command_id, "ok": not error}
    if error:
        doc["error"] = error
    else:
        doc["result"] = result
    return json.dumps(doc, default=str).encode()


def decode(value: bytes | None) -> dict[str, Any] | None:
    """A record of the ops topic, or None for one that is not (the listener skips it)."""
    try:
        doc = json.loads(value or b"")
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("kind") not in (COMMAND, REPLY) or "id" not in doc:
        return None
    return doc


def reader_conf(cfg: KwalConfig) -> dict[str, Any]:
    return cfg.kafka_client(
        **{
            "group.id": f"{cfg.topics.prefix}.ops-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": IDLE_FETCH_WAIT_MS,
            "enable.partition.eof": False,
        }
    )


def send_command(cfg: KwalConfig, op: str, args: dict[str, Any], timeout_s: float) -> Any:
    """Send `op` to the running TN and return its reply's result. OpsError when the TN
    answers with an error, or when no answer comes within `timeout_s`."""
    cmd = Command(uuid.uuid4().hex, op, args)
    producer = Producer(cfg.kafka_client(**{"acks": "all", "linger.ms": 0}))
    offsets: list[int] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is None and msg.offset() is not None:
            offsets.append(int(msg.offset()))

    producer.produce(cfg.topics.ops, encode_command(cmd), key=cmd.id, partition=0, on_delivery=delivered)
    producer.flush(timeout_s)
    if not offsets:
        raise OpsError(f"could not send the {op} command to {cfg.topics.ops} within {timeout_s:.0f}s")
    consumer = Consumer(reader_conf(cfg))
    try:
        consumer.assign([TopicPartition(cfg.topics.ops, 0, offsets[0])])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for msg in poll_batch(consumer, 100, 0.2):
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise OpsError(f"reading {cfg.topics.ops}: {err}")
                    continue
                doc = decode(msg.value())
                if doc is None or doc["kind"] != REPLY or doc["id"] != cmd.id:
                    continue
                if not doc.get("ok"):
                    raise OpsError(f"the TN refused {op}: {doc.get('error', '')}")
                return doc.get("result")
    finally:
        consumer.close()
    raise OpsError(
        f"no TN answered the {op} command within {timeout_s:.0f}s "
        f"(is `kwal tn run` running with topic prefix {cfg.topics.prefix!r}?)"
    )
