"""`infra.reader_stall.StallWatch`: when it checks (a clock the test moves: timing logic
only), what it refuses, what it calls stuck on a real broker (a consumer paused under its
reader stands for librdkafka's fetcher that stopped), and a client it replaces (a closed
consumer stands for one that lost its brokers: every call on it fails)."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from infra.config import ConfigError, KwalConfig
from infra.metrics import METRICS
from infra.reader_stall import LOST_AFTER, MAX_WAIT_S, StallWatch, has_records
from tests.conftest import unique
from tests.waiting import wait_until


def no_consumer() -> Consumer:
    raise AssertionError("the watch made a new consumer where it had no reason to")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_check_is_due_only_after_stall_s_without_records() -> None:
    clock = Clock()
    watch = StallWatch("t", 5.0, "x.stall_s", no_consumer, clock)
    clock.now += 4.9
    assert not watch.polled(False)
    clock.now += 0.2  # 5.1 s without a record
    assert watch.polled(False)
    clock.now += 4.9  # the next check: as long again after this one
    assert not watch.polled(False)
    clock.now += 0.2
    assert watch.polled(False)
    clock.now += 3.0
    assert not watch.polled(True)  # a record: the wait starts again
    clock.now += 4.9
    assert not watch.polled(False)
    clock.now += 0.2
    assert watch.polled(False)


@pytest.mark.parametrize("value", [0.0, -1.0])
def test_a_stall_time_that_is_not_positive_is_refused_naming_the_setting(value: float) -> None:
    with pytest.raises(ConfigError, match=r"cn\.logtail_stall_s must be > 0 seconds"):
        StallWatch("logtail", value, "cn.logtail_stall_s", no_consumer)


def reassigned(label: str) -> float:
    return METRICS.registry.get_sample_value("kwal_reader_reassigned_total", {"reader": label}) or 0.0


def read_offsets(consumer: Consumer, n: int, what: str) -> list[int]:
    """The offsets of the next `n` records `consumer` polls (an AssertionError naming `what`
    when they do not come within 30 s)."""
    got: list[int] = []

    def enough() -> bool:
        m = consumer.poll(0.2)
        if m is not None and m.error() is None:
            got.append(m.offset() or 0)
        return len(got) >= n

    wait_until(what, enough, 30, poll_s=0)
    return got


def _three_records(cfg: KwalConfig, prefix: str) -> tuple[AdminClient, str, Consumer]:
    """A new one-partition topic holding 3 records, and a consumer (not yet assigned)."""
    topic = unique(prefix)
    admin = AdminClient(cfg.kafka_client())
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer(cfg.kafka_client())
    for i in range(3):
        producer.produce(topic, f"r{i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer(cfg.kafka_client(**{"group.id": unique("g"), "enable.auto.commit": False}))
    return admin, topic, consumer


def test_stuck_only_with_records_past_both_positions(
    kwal_config: KwalConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """A reader paused at offset 0 of a topic holding 3 records is stuck (and counted
    under its label, named in the warning); at its end it is not, nor is a reader whose
    own position lags while the consumer's is at the end (markers it never sees)."""
    admin, topic, consumer = _three_records(kwal_config, "stall")
    label = unique("reader")
    clock = Clock()
    watch = StallWatch(label, 1.0, "x.stall_s", no_consumer, clock)

    def counted() -> float:
        return METRICS.registry.get_sample_value(
            "kwal_reader_reassigned_total", {"reader": label}
        ) or 0.0

    try:
        tp = TopicPartition(topic, 0, 0)
        consumer.assign([tp])
        consumer.pause([tp])
        with caplog.at_level(logging.WARNING, logger="infra.reader_stall"):
            assert watch.stuck(consumer, {(topic, 0): 0})
        assert counted() == 1
        assert f"{topic}[0] holds 3 past offset 0" in caplog.text
        # the next check waits twice as long (a fresh fetch may be slow to deliver),
        # and once a poll returns records, stall_s again
        clock.now += 1.5
        assert not watch.polled(False)
        clock.now += 0.6
        assert watch.polled(False)
        watch.polled(True)
        clock.now += 1.1
        assert watch.polled(False)
        assert not watch.stuck(consumer, {(topic, 0): 3})  # the reader is at the end
        consumer.resume([tp])
        read_offsets(consumer, 3, "the consumer read the 3 records")
        # the consumer is at the end while the reader says 1: not stuck (what lies between
        # is for the consumer to skip: markers, aborted records)
        assert not watch.stuck(consumer, {(topic, 0): 1})
        assert counted() == 1
    finally:
        consumer.close()
        admin.delete_topics([topic])


def test_unstick_assigns_again_at_the_readers_positions_and_resumes(kwal_config: KwalConfig) -> None:
    """A stuck reader is assigned again at the positions it gives (here 1, past a record it
    already took) and resumed: it reads on from there, nothing skipped or read twice; at
    the end it is left alone."""
    admin, topic, consumer = _three_records(kwal_config, "unstick")
    label = unique("reader")
    watch = StallWatch(label, 1.0, "x.stall_s", no_consumer)
    try:
        tp = TopicPartition(topic, 0, 0)
        consumer.assign([tp])
        consumer.pause([tp])
        assert watch.unstick(consumer, {(topic, 0): 1}) is consumer
        assert reassigned(label) == 1
        assert read_offsets(consumer, 2, "the reader read on after unstick") == [1, 2]
        assert watch.unstick(consumer, {(topic, 0): 3}) is consumer
        assert reassigned(label) == 1
    finally:
        consumer.close()
        admin.delete_topics([topic])


def test_a_check_that_cannot_read_the_ends_warns_once_per_max_wait(
    kwal_config: KwalConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """A check that cannot read a partition's end (here a topic that does not exist) is not
    a stall, and says why in a warning, at most once per MAX_WAIT_S of the watch's clock."""
    consumer = Consumer(kwal_config.kafka_client(**{"group.id": unique("g")}))
    clock = Clock()
    watch = StallWatch(unique("reader"), 1.0, "x.stall_s", no_consumer, clock)
    missing = {(unique("no-such-topic"), 0): 0}
    said = "the stall check could not read the partitions' ends"
    try:
        with caplog.at_level(logging.WARNING, logger="infra.reader_stall"):
            assert not watch.stuck(consumer, missing)
            assert caplog.text.count(said) == 1
            clock.now += MAX_WAIT_S - 1
            assert not watch.stuck(consumer, missing)
            assert caplog.text.count(said) == 1
            clock.now += 1
            assert not watch.stuck(consumer, missing)
            assert caplog.text.count(said) == 2
    finally:
        consumer.close()


class _Event:
    """A polled message: a record (no error) or an error event (logic only)."""

    def __init__(self, error: object | None) -> None:
        self._error = error

    def error(self) -> object | None:
        return self._error


def test_only_a_record_is_progress_not_an_error_event() -> None:
    """A poll that returned only error events (librdkafka reporting a failed fetch) is
    nothing polled: the check still comes due."""
    assert not has_records([])
    assert not has_records([_Event("fetch failed"), _Event("fetch failed")])
    assert has_records([_Event("fetch failed"), _Event(None)])


def test_a_reader_whose_checks_keep_failing_gets_a_new_client_at_its_positions(
    kwal_config: KwalConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """A consumer on which every check fails (closed here; in the field, a client that lost
    every broker it knew) is kept through LOST_AFTER - 1 failed checks, then replaced by a
    new one from the reader's factory, assigned at the reader's positions: it reads on from
    offset 1, nothing skipped or read twice. The replacement is counted and said."""
    admin, topic, lost = _three_records(kwal_config, "lost")
    lost.close()  # every call on it fails from now on
    label = unique("reader")
    made: list[Consumer] = []

    def new_consumer() -> Consumer:
        made.append(Consumer(kwal_config.kafka_client(**{"group.id": unique("g")})))
        return made[-1]

    watch = StallWatch(label, 1.0, "x.stall_s", new_consumer)
    positions = {(topic, 0): 1}
    try:
        for _ in range(LOST_AFTER - 1):
            assert watch.unstick(lost, positions) is lost
        assert not made
        with caplog.at_level(logging.WARNING, logger="infra.reader_stall"):
            fresh = watch.unstick(lost, positions)
        assert made == [fresh]
        assert f"{LOST_AFTER} stall checks in a row could not read" in caplog.text
        replaced = METRICS.registry.get_sample_value("kwal_reader_replaced_total", {"reader": label})
        assert replaced == 1
        assert reassigned(label) == 0
        assert read_offsets(fresh, 2, "the new client read on from the reader's position") == [1, 2]
        # a good check ends the count: the new client is kept
        assert watch.unstick(fresh, {(topic, 0): 3}) is fresh
        assert watch.failed_checks == 0
    finally:
        for c in made:
            c.close()
        admin.delete_topics([topic])


def test_a_good_check_between_failures_starts_the_count_again(kwal_config: KwalConfig) -> None:
    """Only LOST_AFTER failures IN A ROW replace the client: a broker away for a while and
    back fails some checks, and its reader's client is not at fault."""
    admin, topic, consumer = _three_records(kwal_config, "blip")
    watch = StallWatch(unique("reader"), 1.0, "x.stall_s", no_consumer)
    missing = {(unique("no-such-topic"), 0): 0}
    try:
        consumer.assign([TopicPartition(topic, 0, 3)])
        for _ in range(3):
            for _ in range(LOST_AFTER - 1):
                assert watch.unstick(consumer, missing) is consumer
            assert watch.unstick(consumer, {(topic, 0): 3}) is consumer  # at the end: fine
    finally:
        consumer.close()
        admin.delete_topics([topic])
