"""`infra.reader_stall.StallWatch`: when it checks (a clock the test moves: timing logic
only), what it refuses, and what it calls stuck on a real broker (a consumer paused under
its reader stands for librdkafka's fetcher that stopped)."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from infra.config import ConfigError, KwalConfig
from infra.metrics import METRICS
from infra.reader_stall import MAX_WAIT_S, StallWatch, has_records
from tests.conftest import unique
from tests.waiting import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_check_is_due_only_after_stall_s_without_records() -> None:
    clock = Clock()
    watch = StallWatch("t", 5.0, "x.stall_s", clock)
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
        StallWatch("logtail", value, "cn.logtail_stall_s")


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
    watch = StallWatch(label, 1.0, "x.stall_s", clock)

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
        got: list[int] = []

        def read_all() -> bool:
            m = consumer.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.offset() or 0)
            return len(got) == 3

        wait_until("the consumer read the 3 records", read_all, 30, poll_s=0)
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
    watch = StallWatch(unique("reader"), 1.0, "x.stall_s")
    try:
        tp = TopicPartition(topic, 0, 0)
        consumer.assign([tp])
        consumer.pause([tp])
        assert watch.unstick(consumer, {(topic, 0): 1})
        got: list[int] = []

        def read_on() -> bool:
            m = consumer.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.offset() or 0)
            return len(got) >= 2

        wait_until("the reader read on after unstick", read_on, 30, poll_s=0)
        assert got == [1, 2]
        assert not watch.unstick(consumer, {(topic, 0): 3})
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
    watch = StallWatch(unique("reader"), 1.0, "x.stall_s", clock)
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
