"""Secure mode's gateway: per-principal topics in, per-principal topics out.

Why a gateway: the TN's exactly-once bookkeeping (`tn.service.service`) is built on ONE
ordered requests log and ONE results log (offsets C and R in `kwal_system.progress`).
Kafka authenticates the writer of a record but does not stamp it on the record; what it
can guarantee is *who may write a topic*. So in secure mode each service writes its own
`<prefix>.requests.<principal>` (a WRITE ACL for that principal only), and the gateway,
running as the TN's principal, is the only writer of the TN's own requests topic:

1. requests: consume every `<prefix>.requests.<principal>` by pattern (consumer group
   `<prefix>.tn-gateway`, so new principals' topics join by themselves), and copy each
   record to `<prefix>.requests` with the principal *taken from the topic name* in the
   `kwal-principal` header; the TN trusts that header because nobody else may write there;
2. results: consume `<prefix>.results` (group `<prefix>.tn-results`) and copy each result
   to `<prefix>.results.<principal>` of the principal the TN answered (the result's
   client id, which the TN sets to the sender's principal), its request id unscoped
   (`infra.principals.unscoped_id`). Only that principal may read that topic.

Each copy is at least once: a batch is produced, its delivery awaited, and only then
are the consumed offsets committed. A copy made twice after a crash is harmless: the TN
answers a repeated request id with its first outcome, and clients take the first result
of an id and ignore the rest. A record that cannot be addressed (a requests topic whose
name is no principal, a result without one) is dropped and counted
(`kwal_security_dropped{what}`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from infra.config import KwalConfig
from infra.kafka_io import FETCH_WAIT_MS, poll_batch
from infra.metrics import METRICS
from infra.principals import (
    PRINCIPAL_HEADER,
    check_principal,
    principal_of_topic,
    requests_pattern,
    unscoped_id,
)
from schemas.exceptions import CodecError
from schemas.requests import decode_result, encode_result

log = logging.getLogger("kwal.tn.gateway")

# (topic, key, value, headers) to produce, or None to drop the record
Copy = tuple[str, bytes | None, bytes, list[tuple[str, str | bytes | None]] | None]


class PrincipalGateway:
    """The two copy loops of the module docstring, one thread each."""

    def __init__(self, cfg: KwalConfig, metadata_refresh_ms: int = 1000) -> None:
        self.cfg = cfg
        self.metadata_refresh_ms = metadata_refresh_ms
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.forwarded = 0
        self.relayed = 0

    def start(self) -> PrincipalGateway:
        t = self.cfg.topics
        loops: list[tuple[str, str, Callable[[Any], Copy | None], str]] = [
            (requests_pattern(self.cfg), f"{t.prefix}.tn-gateway", self._request_copy, "requests"),
            (t.results, f"{t.prefix}.tn-results", self._result_copy, "results"),
        ]
        for source, group, copy, name in loops:
            consumer = Consumer(
                self.cfg.kafka_client(
                    **{
                        "group.id": group,
                        "enable.auto.commit": False,
                        "auto.offset.reset": "earliest",
                        # results a fenced TN wrote are aborted: never copied (docs/fencing.md)
                        "isolation.level": "read_committed",
                        "fetch.wait.max.ms": FETCH_WAIT_MS,
                        "topic.metadata.refresh.interval.ms": self.metadata_refresh_ms,
                        "session.timeout.ms": 10_000,
                        "heartbeat.interval.ms": 1000,
                    }
                )
            )
            consumer.subscribe([source])
            producer = Producer(
                self.cfg.kafka_client(
                    **{
                        "enable.idempotence": True,
                        "acks": "all",
                        "linger.ms": 1,
                        "message.max.bytes": self.cfg.max_record_bytes,
                        "message.timeout.ms": 30_000,
                    }
                )
            )
            th = threading.Thread(
                target=self._loop, args=(consumer, producer, copy, name),
                name=f"kwal-gateway-{name}", daemon=True,
            )
            th.start()
            self._threads.append(th)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(timeout=timeout_s)

    def healthy(self) -> bool:
        return all(th.is_alive() for th in self._threads) and not self._stop.is_set()

    # ---- the copies -----------------------------------------------------------------------

    def _request_copy(self, msg: Any) -> Copy | None:
        """Step 1: the principal from the topic name, never from the record."""
        principal = principal_of_topic(self.cfg, msg.topic() or "")
        if principal is None:
            METRICS.security_dropped.labels("request_without_principal").inc()
            return None
        headers: list[tuple[str, str | bytes | None]] = [(PRINCIPAL_HEADER, principal.encode())]
        return (self.cfg.topics.requests, msg.key(), msg.value() or b"", headers)

    def _result_copy(self, msg: Any) -> Copy | None:
        """Step 2: to the results topic of the principal the TN answered."""
        try:
            res = decode_result(msg.value() or b"")
            principal = check_principal(res.client_id)
        except (CodecError, ValueError) as e:
            METRICS.security_dropped.labels("result_without_principal").inc()
            log.warning("result at offset %s has no principal to go to: %s", msg.offset(), e)
            return None
        rid = unscoped_id(principal, res.request_id)
        value = encode_result(dataclasses.replace(res, request_id=rid))
        return (self.cfg.topics.results_of(principal), rid.encode(), value, None)

    def _loop(
        self, consumer: Consumer, producer: Producer, copy: Callable[[Any], Copy | None], name: str
    ) -> None:
        try:
            while not self._stop.is_set():
                try:
                    msgs = poll_batch(consumer, 500, 0.1)
                except KafkaException as e:
                    log.warning("gateway %s: consume failed: %s", name, e)
                    self._stop.wait(0.2)
                    continue
                offsets: dict[tuple[str, int], int] = {}
                copies: list[Copy] = []
                for msg in msgs:
                    if msg.error() is not None:
                        continue
                    offsets[(msg.topic(), msg.partition())] = (msg.offset() or 0) + 1
                    made = copy(msg)
                    if made is not None:
                        copies.append(made)
                if not offsets:
                    continue
                if not self._produce_all(producer, copies, name):
                    return  # stopping: the uncommitted batch is copied again by the next run
                try:
                    consumer.commit(
                        offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                        asynchronous=False,
                    )
                except KafkaException as e:
                    # a rebalance took the partitions: their new owner copies the batch
                    # again from the last commit (a duplicate, which is harmless)
                    log.warning("gateway %s: offsets not committed: %s", name, e)
                if name == "requests":
                    self.forwarded += len(copies)
                else:
                    self.relayed += len(copies)
        finally:
            producer.flush(5)
            consumer.close()

    def _produce_all(self, producer: Producer, copies: list[Copy], name: str) -> bool:
        """Produce `copies` until each is delivered (a failed one again, after a pause);
        False when stopping first."""
        todo = copies
        while todo:
            failed: list[Copy] = []
            for c in todo:
                topic, key, value, headers = c

                def report(err: Any, _msg: Any, c: Copy = c, failed: list[Copy] = failed) -> None:
                    if err is not None:
                        log.warning("gateway %s: copy to %s failed (again): %s", name, c[0], err)
                        failed.append(c)

                while True:
                    try:
                        producer.produce(topic, value=value, key=key, headers=headers, on_delivery=report)
                        break
                    except BufferError:
                        producer.poll(0.01)
            while len(producer) and not self._stop.is_set():
                producer.flush(0.5)
            if self._stop.is_set() and len(producer):
                return False
            todo = failed
            if todo:
                time.sleep(0.2)
        return True
