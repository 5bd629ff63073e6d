"""The WAL pump thread outlives every error its producer or its checks raise.

A fake producer stands in for confluent-kafka here: what is tested is the pump's own
routing of errors (fatal -> the on_fatal hooks, once; anything else -> logged, polling
goes on), which has nothing to do with a broker. The fatal error itself is what
librdkafka raised from `poll` in a broker-restart run (OUT_OF_ORDER_SEQUENCE_NUMBER).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException

from tn.logstore.kafka_backend.kio import Pump


class RaisingProducer:
    """poll() raises the errors queued in `raises`, then returns quietly."""

    def __init__(self, raises: list[BaseException]) -> None:
        self.raises = list(raises)
        self.polls = 0

    def poll(self, timeout: float) -> int:
        self.polls += 1
        if self.raises:
            raise self.raises.pop(0)
        time.sleep(timeout)
        return 0


def fatal() -> KafkaException:
    return KafkaException(
        KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "sequence desynchronization", fatal=True)
    )


def wait_for(cond: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_a_fatal_poll_error_reaches_the_hooks_once_and_the_pump_goes_on() -> None:
    producer = RaisingProducer([fatal(), fatal()])
    pump = Pump(producer)  # type: ignore[arg-type]
    seen: list[KafkaException] = []
    ticks = threading.Semaphore(0)
    pump.add_on_fatal(seen.append)
    pump.add_tick(ticks.release)
    pump.start()
    try:
        assert wait_for(lambda: producer.polls >= 5)
        assert len(seen) == 1, seen  # the second fatal error is the same spent producer
        assert seen[0].args[0].code() == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert pump.fatal is seen[0]
        assert ticks.acquire(timeout=2)  # the watchdog still runs
        late: list[KafkaException] = []
        pump.add_on_fatal(late.append)  # a hook added afterwards hears of it at once
        assert late == seen
    finally:
        pump.stop()
    assert not pump._thread.is_alive()


def test_other_errors_are_logged_and_do_not_stop_polling_or_ticks() -> None:
    producer = RaisingProducer(
        [KafkaException(KafkaError(KafkaError._TRANSPORT, "down")), RuntimeError("callback bug")]
    )
    pump = Pump(producer)  # type: ignore[arg-type]
    seen: list[KafkaException] = []
    ticked = threading.Event()
    calls = 0

    def flaky_tick() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("tick bug")
        ticked.set()

    pump.add_on_fatal(seen.append)
    pump.add_tick(flaky_tick)
    pump.start()
    try:
        assert ticked.wait(2)  # the second tick ran after the first raised
        assert wait_for(lambda: producer.polls >= 4)
        assert seen == [] and pump.fatal is None  # nothing fatal was reported
    finally:
        pump.stop()
