"""Small Kafka I/O helpers shared by the backend's modules.

- `Pump`: the one thread that serves the driver's single producer (delivery
  callbacks run on it) and runs periodic checks (the append watchdog). It
  never dies of an error: a fatal producer error goes to its `on_fatal` hooks
  (the writer fails: the producer can send nothing more), anything else is
  logged and polling goes on.
- `produce_wait`: produce one record and wait, bounded, for its acknowledgement.
- `read_until`: read partitions from their low watermarks up to (excluding) a
  known end offset per partition. The end offsets come from markers this
  process produced itself (their delivery reports give exact offsets), never
  from the high watermark, which the embedded broker can report wrongly.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from infra.kafka_io import poll_batch
from infra.kafka_txn import TxnChannel
from tn.logstore.kafka_backend.exceptions import AppendTimeoutError, ReplayTimeoutError

log = logging.getLogger(__name__)

FETCH_WAIT_MS = 75  # the embedded broker's sweet spot is 50-100 ms


class Pump:
    """Polls the producer on one daemon thread; runs `tick()` hooks between polls."""

    def __init__(self, producer: Producer | TxnChannel, name: str = "kwal-wal-pump") -> None:
        self._producer = producer
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._parked = threading.Event()
        self._ticks: list[Callable[[], None]] = []
        self._on_fatal: list[Callable[[KafkaException], None]] = []
        self._fatal: KafkaException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def add_tick(self, fn: Callable[[], None]) -> None:
        self._ticks.append(fn)

    def add_on_fatal(self, fn: Callable[[KafkaException], None]) -> None:
        """Call fn(error) once the producer reports a fatal error (at once if it already
        has). After one, librdkafka refuses every produce: the producer is spent."""
        self._on_fatal.append(fn)
        if self._fatal is not None:
            fn(self._fatal)

    @property
    def fatal(self) -> KafkaException | None:
        return self._fatal

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._running.is_set():
                self._parked.set()
                self._running.wait(0.05)
                continue
            try:
                self._producer.poll(0.02)
            except KafkaException as e:  # librdkafka raises fatal errors from poll
                self._poll_failed(e)
            except Exception:  # noqa: BLE001 - a delivery callback's bug must not stop acks
                log.exception("%s: error while serving the producer", self._thread.name)
            for fn in self._ticks:
                try:
                    fn()
                except Exception:  # noqa: BLE001 - the watchdog goes on
                    log.exception("%s: periodic check failed", self._thread.name)

    def _poll_failed(self, e: KafkaException) -> None:
        """`poll` raised: a fatal error is reported to the on_fatal hooks once (later ones
        are the same spent producer: the loop slows down and keeps serving the ticks);
        anything else is logged."""
        err = e.args[0] if e.args else None
        if not (isinstance(err, KafkaError) and err.fatal()):
            log.warning("%s: producer error: %s", self._thread.name, e)
            return
        if self._fatal is not None:
            time.sleep(0.05)
            return
        self._fatal = e
        log.error("%s: fatal producer error, the WAL writer stops: %s", self._thread.name, e)
        for fn in self._on_fatal:
            try:
                fn(e)
            except Exception:  # noqa: BLE001
                log.exception("%s: on_fatal hook failed", self._thread.name)

    def pause(self) -> None:
        """Stop serving deliveries and ticks until `resume()` (fault tests use it to hold acks)."""
        self._parked.clear()
        self._running.clear()
        if self._thread.is_alive() and not self.is_current():
            self._parked.wait(1.0)  # returns once no poll is running any more

    def resume(self) -> None:
        self._running.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._running.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread


def produce_wait(
    producer: Producer | TxnChannel,
    topic: str,
    value: bytes | None,
    timeout_s: float,
    key: bytes | None = None,
    headers: list[tuple[str, str | bytes | None]] | None = None,
    partition: int | None = None,
) -> tuple[int, int]:
    """Produce one record (acks per the producer) and wait for it; return (partition, offset).

    A delivery without an offset (a duplicate-sequence answer) proves nothing (see
    `writer`), so the record is produced again until a delivery names its offset. The
    producer must be polled by a `Pump` (or this thread must not be the pump).
    """
    kwargs: dict[str, Any] = {"value": value}
    if key is not None:
        kwargs["key"] = key
    if headers:
        kwargs["headers"] = headers
    if partition is not None:
        kwargs["partition"] = partition
    deadline = time.monotonic() + timeout_s
    while True:
        done: Future[tuple[int, int | None]] = Future()

        def on_delivery(
            err: KafkaError | None, msg: Message, done: Future[tuple[int, int | None]] = done
        ) -> None:
            if err is not None:
                done.set_exception(AppendTimeoutError(f"produce to {topic} failed: {err}"))
            else:
                done.set_result((int(msg.partition() or 0), msg.offset()))

        producer.produce(topic, on_delivery=on_delivery, **kwargs)
        try:
            p, off = done.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout as e:
            raise AppendTimeoutError(
                f"no acknowledgement for a record on {topic} within {timeout_s:.1f}s"
            ) from e
        if off is not None:
            return p, off


def reader_conf(base: Mapping[str, Any]) -> dict[str, Any]:
    """Settings of an internal reader: assign() only, no group joins, no commits."""
    conf = dict(base)
    conf.update(
        {
            "group.id": f"kwal-reader-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            # a replaced TN's records after its fence are aborted: never read them
            "isolation.level": "read_committed",
        }
    )
    return conf


def _start(consumer: Consumer, topic: str, partition: int, start: int, timeout_s: float) -> int:
    """An exact offset to start at: `start`, or the log start where that is higher. Asked
    of the broker (ListOffsets) rather than left to OFFSET_BEGINNING, which librdkafka
    resolves only after a fetch backoff (~0.5 s per reader: four readers open a WAL)."""
    try:
        low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s)
    except KafkaException:
        return start or OFFSET_BEGINNING
    return max(start, int(low))


def read_until(
    conf: Mapping[str, Any],
    topic: str,
    ends: Mapping[int, int],
    timeout_s: float,
    starts: Mapping[int, int] | None = None,
) -> Iterator[Message]:
    """Yield every record of `topic` with starts[p] <= offset < ends[p], per partition in
    offset order.

    Partitions are read from `starts[p]` or, where absent (or already deleted), from
    their low watermark. Bounded: `ReplayTimeoutError` when the ends are not reached
    within `timeout_s`.
    """
    first = dict(starts or {})
    todo = {p: end for p, end in ends.items() if end > max(0, first.get(p, 0))}
    if not todo:
        return
    consumer = Consumer(reader_conf(conf))
    try:
        deadline = time.monotonic() + timeout_s
        consumer.assign([TopicPartition(topic, p, _start(consumer, topic, p, first.get(p, 0), timeout_s)) for p in todo])
        while todo:
            if time.monotonic() > deadline:
                raise ReplayTimeoutError(
                    f"reading {topic} did not reach offsets {todo} within {timeout_s:.0f}s"
                )
            for msg in poll_batch(consumer, 500, 0.2):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise ReplayTimeoutError(f"reading {topic}: {err}")
                p = int(msg.partition() or 0)
                end = todo.get(p)
                off = int(msg.offset() or 0)
                if end is None:
                    continue
                if first.get(p, 0) <= off < end:
                    yield msg
                if off + 1 >= end:
                    del todo[p]
                    if todo:
                        consumer.incremental_unassign([TopicPartition(topic, p)])
    finally:
        consumer.close()
