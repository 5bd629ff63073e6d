"""The TN's side of the ops topic (infra.control): reads operator commands from the
topic's end at start and answers each one. Commands: `compact` (args: `table`, optional)
runs the compaction policy now (tn.checkpoint.scheduler)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from infra.config import KwalConfig
from infra.control import COMMAND, decode, encode_reply, reader_conf
from infra.kafka_io import poll_batch
from tn.checkpoint.scheduler import CompactionScheduler
from tn.exceptions import TnError

log = logging.getLogger("kwal.tn.ops")


class OpsListener:
    def __init__(self, cfg: KwalConfig, compaction: CompactionScheduler) -> None:
        self.cfg = cfg
        self.compaction = compaction
        self._consumer = Consumer(reader_conf(cfg))
        self._producer = Producer(cfg.kafka_client(**{"acks": "all", "linger.ms": 0}))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kwal-tn-ops", daemon=True)
        self.answered = 0

    def start(self, timeout_s: float = 10.0) -> OpsListener:
        """Position at the topic's end (before the TN says it is ready), then listen."""
        tp = TopicPartition(self.cfg.topics.ops, 0)
        _, high = self._consumer.get_watermark_offsets(tp, timeout=timeout_s)
        self._consumer.assign([TopicPartition(self.cfg.topics.ops, 0, max(0, high))])
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msgs = poll_batch(self._consumer, 100, 0.2)
            except Exception:  # noqa: BLE001 - the consumer closed under us, a broker hiccup
                if self._stop.is_set():
                    return
                continue
            for msg in msgs:
                if msg.error() is not None:
                    continue
                doc = decode(msg.value())
                if doc is not None and doc["kind"] == COMMAND:
                    self._answer(doc)

    def _answer(self, doc: dict[str, Any]) -> None:
        cid, op, args = str(doc["id"]), doc.get("op"), doc.get("args") or {}
        result: Any = None
        error = ""
        if op == "compact":
            try:
                table = args.get("table") or None
                result = [c.as_dict() for c in self.compaction.run_once(table)]
            except TnError as e:
                error = str(e)
            except Exception as e:  # noqa: BLE001 - one command's failure is its answer
                log.exception("ops command %s failed", op)
                error = f"{type(e).__name__}: {e}"
        else:
            error = f"unknown ops command {op!r} (known: compact)"
        self._producer.produce(self.cfg.topics.ops, encode_reply(cid, result, error), key=cid, partition=0)
        self._producer.flush(10)
        self.answered += 1

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._consumer.close()
        self._producer.flush(timeout_s)
