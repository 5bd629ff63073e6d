"""A Kafka reader that stopped fetching: found, and assigned again.

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
   machine, and assigning again meanwhile would start it over each time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from infra.config import ConfigError
from infra.metrics import METRICS

log = logging.getLogger(__name__)

MAX_WAIT_S = 60.0  # the longest wait between two checks (step 4's doubling stops there)


def has_records(messages: Sequence[Any]) -> bool:
    """Whether a poll's messages hold a record (not only error events)."""
    return any(m.error() is None for m in messages)


class StallWatch:
    """The check above for one reader. `reader` names it in logs and in the metric's label;
    `setting` is the config setting `stall_s` came from (named when it is refused)."""

    def __init__(
        self,
        reader: str,
        stall_s: float,
        setting: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not stall_s > 0:
            raise ConfigError(f"{setting} must be > 0 seconds, got {stall_s}")
        self.reader = reader
        self.stall_s = stall_s
        self._wait = stall_s  # until the next check (step 4)
        self._clock = clock
        self._last = clock()
        self._counter = METRICS.reader_reassigned.labels(reader)
        self._next_failure_log = float("-inf")  # `_check_failed`

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
            self._check_failed(e)
            return False
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

    def unstick(self, consumer: Consumer, positions: Mapping[tuple[str, int], int]) -> bool:
        """Steps 2-3 for a reader whose assignment is exactly `positions`: when `stuck`, assign
        them again at the reader's positions and resume them (a no-op unless something
        paused them: a reader paused on purpose does not call this). True when it did."""
        if not self.stuck(consumer, positions):
            return False
        parts = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
        consumer.assign(parts)
        consumer.resume(parts)
        return True
