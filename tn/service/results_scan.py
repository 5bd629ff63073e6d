"""The TN's start-up read of its results topic: every result from an offset to the end.

It reads `read_committed`: what a replaced (fenced) TN published after its fence is
aborted and never taken as an answer (docs/fencing.md). The reported high watermark can
lag the true end by a batch, and transaction markers occupy offsets no message shows, so
the end is the consumer's position once nothing new arrives for a moment.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from confluent_kafka import Consumer, TopicPartition

from infra.config import KwalConfig
from infra.kafka_io import poll_batch
from schemas.exceptions import CodecError
from schemas.requests import TxnResult, decode_results

log = logging.getLogger("kwal.tn.service")


def read_results(cfg: KwalConfig, from_offset: int) -> Iterator[TxnResult]:
    """The results at `from_offset` and after, in topic order (undecodable ones skipped)."""
    topic = cfg.topics.results
    consumer = Consumer(
        cfg.kafka_client(
            **{
                "group.id": f"{cfg.topics.prefix}.tn-scan",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 50,
                "enable.partition.eof": True,
                # what a replaced (fenced) TN published after its fence is aborted
                "isolation.level": "read_committed",
            }
        )
    )
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        if high <= from_offset:
            return
        consumer.assign([TopicPartition(topic, 0, from_offset)])
        position = from_offset
        idle_since = time.monotonic()
        # The reported high watermark can lag the true end by a batch: read to
        # it, then keep reading until nothing new arrives for a moment.
        while True:
            msgs = poll_batch(consumer, 1000, 0.1)
            got = False
            for msg in msgs:
                if msg.error() is not None:
                    continue
                got = True
                position = (msg.offset() or 0) + 1
                try:
                    results = decode_results(msg.value() or b"")
                except CodecError:
                    continue
                yield from results
            # the consumer's position moves past transaction markers and aborted
            # records too, which no message shows
            now = consumer.position([TopicPartition(topic, 0)])[0].offset
            if now is not None and now > position:
                position = now
            if got:
                idle_since = time.monotonic()
            elif position >= high and time.monotonic() - idle_since > 0.3:
                return
            elif time.monotonic() - idle_since > 10:
                log.warning("results scan stalled at %s (high watermark %s)", position, high)
                return
    finally:
        consumer.close()
