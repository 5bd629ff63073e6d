"""A Kafka reader that stopped fetching: found, and assigned again (or given a new client).

librdkafka's consumer can stop fetching a partition it was given with `assign()` after the
broker restarts (its fetch state stays in offset validation; librdkafka issues 4492 and
5153). The reader then polls nothing, logs nothing, and the records pile up behind it:
seen for the TN's requests reader in `tests/faults/test_broker_restart.py` (1 run in 6).
Every long-lived kwal reader that follows topics by `assign()` (the TN's requests reader,
a CN's logtail reader, the clients' results reader) runs the same check:

1. each poll tells the watch whether it returned a record (`StallWatch.polled`, with
   `has_records`): an error event is no progress (librdkafka can report a fetch failure
   again and again while the partition delivers nothing);
2. after `stall_s` with nothing polled, the reader calls `StallWatch.unstick` with the
   position it reads from next on each partition: the watch reads each partition's high
   watermark and the consumer's own position (which moves past transaction markers and
   aborted records, never delivered to the reader);
3. a partition whose high watermark is past both positions is stuck: the watch logs a
   warning naming it and counts `kwal_reader_reassigned_total{reader=...}`, and assigns
   the reader's partitions again at the reader's own positions, which starts a fresh
   fetch state. Nothing is skipped or read twice;
4. the next check comes `stall_s` later (a broker that is away fails the check: it is
   made again then, with a warning at most every `MAX_WAIT_S`); after a reassignment,
   twice as long as the wait before it (at most `MAX_WAIT_S`), until a poll returns
   something: a fresh fetch state can take more than `stall_s` to deliver on a busy
   machine, and assigning again meanwhile would start it over each time;
5. `LOST_AFTER` checks in a row that could not read the partitions' ends replace the
   consumer with a new one (the reader's factory) assigned at the reader's positions, and
   count `kwal_reader_replaced_total{reader=...}`. A client can lose its brokers for good:
   a restarting Apache Kafka node answers Metadata with no broker at all (measured: 0-21
   such answers per restart of a single node, docs/broker-restart.md), and librdkafka
   (issue 5301, reported on 2.13) then drops every broker it knows and never bootstraps
   again. Its reader fails every check with "Unknown partition", as the
   clients' results reader of CI run v9 did for over 120 s after the broker was back. A
   new client bootstraps from `bootstrap.servers`. While a broker stays away this repeats
   every `LOST_AFTER` checks, which costs a connection attempt each time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from infra.config import ConfigError
from infra.metrics import METRICS

log = logging.getLogger(__name__)

MAX_WAIT_S = 60.0  # the longest wait between two checks (step 4's doubling stops there)
LOST_AFTER = 3  # failed checks in a row that replace the consumer (step 5)


def has_records(messages: Sequence[Any]) -> bool:
    """Whether a poll's messages hold a record (not only error events)."""
    return any(m.error() is None for m in messages)


class StallWatch:
    """The check above for one reader. `reader` names it in logs and in the metrics' label;
    `setting` is the config setting `stall_s` came from (named when it is refused);
    `new_consumer` makes a consumer with the reader's settings, not yet assigned (step 5)."""

    def __init__(
        self,
        reader: str,
        stall_s: float,
        setting: str,
        new_consumer: Callable[[], Consumer],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not stall_s > 0:
            raise ConfigError(f"{setting} must be > 0 seconds, got {stall_s}")
        self.reader = reader
        self.stall_s = stall_s
        self._wait = stall_s  # until the next check (step 4)
        self._clock = clock
        self._last = clock()
        self._new_consumer = new_consumer
        self._counter = METRICS.reader_reassigned.labels(reader)
        self._replaced = METRICS.reader_replaced.labels(reader)
        self._next_failure_log = float("-inf")  # `_check_failed`
        self.failed_checks = 0  # in a row (step 5)

    def polled(self, got_records: bool) -> bool:
        """Step 1: note one poll. True when the check is due (then the next is due
        step 4's wait later)."""
        now = self._clock()
        if got_records:
            self._last = now
            self._wait = self.stall_s
            return False
        if now - self._last < self._wait:
            return False
        self._last = now
        return True

    def stuck(self, consumer: Consumer, positions: Mapping[tuple[str, int], int]) -> bool:
        """Steps 2-3: whether any partition of `positions` ((topic, partition) -> the offset
        the reader reads next) holds records past both the reader's and the consumer's
        position. The caller assigns again when it is (each reader knows its assignment);
        the warning and the count are made here."""
        parts = [TopicPartition(t, p) for t, p in positions]
        try:
            at = {(tp.topic, tp.partition): tp.offset for tp in consumer.position(parts)}
            behind: list[tuple[str, int, int, int]] = []
            for (topic, partition), position in positions.items():
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=2)
                if high > max(position, at.get((topic, partition), -1)):
                    behind.append((topic, partition, position, high))
        except Exception as e:  # noqa: BLE001 - the broker may be away: step 4
            self.failed_checks += 1
            self._check_failed(e)
            return False
        self.failed_checks = 0
        if not behind:
            return False
        log.warning(
            "%s reader: nothing polled for %.0f s while %s; assigning again at its positions",
            self.reader,
            self._wait,
            ", ".join(f"{t}[{p}] holds {h - o} past offset {o}" for t, p, o, h in behind),
        )
        self._counter.inc()
        self._wait = min(self._wait * 2, max(MAX_WAIT_S, self.stall_s))
        return True

    def _check_failed(self, e: Exception) -> None:
        """A check that could not read the partitions' ends is a warning, at most one per
        MAX_WAIT_S: a broker that is away fails every check (step 4), and a reader whose
        own client cannot reach the broker while others can would otherwise stall without
        a word."""
        now = self._clock()
        if now < self._next_failure_log:
            log.debug("%s reader stall check: %s", self.reader, e)
            return
        self._next_failure_log = now + MAX_WAIT_S
        log.warning(
            "%s reader: nothing polled for %.0f s and the stall check could not read the "
            "partitions' ends (%s); it is made again later",
            self.reader,
            self._wait,
            e,
        )

    def unstick(self, consumer: Consumer, positions: Mapping[tuple[str, int], int]) -> Consumer:
        """Steps 2-5 for a reader whose assignment is exactly `positions`. Returns the consumer
        the reader polls from now on: `consumer` itself (assigned again at the reader's
        positions and resumed when it was stuck: resuming is a no-op unless something paused
        it, and a reader paused on purpose does not call this), or a new consumer assigned
        there in its place when `consumer` failed `LOST_AFTER` checks in a row."""
        parts = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
        if self.stuck(consumer, positions):
            consumer.assign(parts)
            consumer.resume(parts)
            return consumer
        if self.failed_checks < LOST_AFTER:
            return consumer
        log.warning(
            "%s reader: %d stall checks in a row could not read the partitions' ends; "
            "replacing its Kafka client with a new one, assigned at its positions",
            self.reader,
            self.failed_checks,
        )
        self.failed_checks = 0
        self._replaced.inc()
        fresh = self._new_consumer()
        fresh.assign(parts)
        # a client that lost its brokers can take its time to close: not on the reader's thread
        threading.Thread(target=_close_quietly, args=(consumer,), name="kwal-close-lost", daemon=True).start()
        return fresh


def _close_quietly(consumer: Consumer) -> None:
    try:
        consumer.close()
    except Exception as e:  # noqa: BLE001 - already closed, or the client is beyond saving
        log.debug("closing a replaced consumer: %s", e)
