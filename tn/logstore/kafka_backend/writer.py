"""Group commit: many entries per Kafka record, several records in flight.

`GroupWriter.append(lsn, payload)`, numbered as it runs:

1. refuse when the writer failed (fenced, broker lost): the future fails at once;
2. wait, bounded by `append_timeout_s`, until the window has room for `lsn`
   (`WindowTimeoutError` otherwise; the LSN is then not consumed);
3. add the entry to the open group and register its future with the window;
4. issue the group as one record when it is full (`group_max_entries`,
   `group_max_bytes`) or when fewer than `max_in_flight` records are in
   flight: one appender gets one-entry records at once, many appenders get
   groups that fill while earlier records are in flight (adaptive group commit).

Issuing a record: round-robin partition; headers carry epoch, first LSN, count,
the window's contiguous acknowledged LSN at that moment and the record format
version. A group of WAL entries (`schemas.codec.EncodedEntry` payloads) is
written as one columnar version 2 value (`schemas.wal_record`); other payloads
are framed as version 1.

Delivery (on the pump thread): a delivery report without an offset is not
proof of durability. The broker answered DUPLICATE_SEQUENCE_NUMBER ("already
written"), and the embedded broker gives that answer after a restart for a
record it lost. The entries are issued again as a new record, on the same
partition, and the new record's delivery acknowledges them. A copy of a
record that was in fact written is harmless: replay keeps the first copy of
each LSN. A durable record is noted in the map and the window. The futures the
window acknowledges go, as one batch, to the writer's completion thread, which
completes them **in LSN order** (done-callbacks run there: no user code runs on
the pump or under the writer's lock, and the pump's work per record does not
grow with the entries it holds). A failed delivery, or an entry
unacknowledged for longer than `append_timeout_s` (the watchdog `tick`),
fails the writer: every pending future fails, later appends fail at once.
Batches are queued under the writer's lock, so successes and failures reach
the completion thread in LSN order. Nothing is acknowledged that was not
durable with all entries before it.
"""

from __future__ import annotations

import bisect
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message, Producer

from infra.kafka_txn import TxnChannel
from schemas.wal_record import FRAME_OVERHEAD, RECORD_LATEST
from tn.logstore.ack_future import AckFuture, set_results
from tn.logstore.driver import LogClosedError
from tn.logstore.kafka_backend.exceptions import (
    AppendFailedError,
    AppendTimeoutError,
    WindowTimeoutError,
)
from tn.logstore.kafka_backend.headers import encode_value, entries_headers
from tn.logstore.kafka_backend.replay import RecordInfo, Segment
from tn.logstore.kafka_backend.window import Window

log = logging.getLogger(__name__)

GROWTH = 4  # a busy writer's next record waits for GROWTH ** in_flight entries

_Issue = tuple[int, list[bytes], int, int]  # first LSN, payloads, partition, acked
# futures to complete, in LSN order, and the error to fail them with (None: their LSN)
_Batch = tuple[list[tuple[int, Future[int]]], BaseException | None]


@dataclass(frozen=True)
class WriterSettings:
    window: int
    group_max_entries: int
    group_max_bytes: int
    max_in_flight: int
    append_timeout_s: float
    # pulled by a transactional bus (infra.kafka_txn): the open group is issued when the
    # bus starts its next transaction (`issue_open_group`), or when full; `kick` tells
    # the bus an idle group has entries
    kick: Callable[[], None] | None = None
    # the record format written (`schemas.wal_record`): 2, columnar, for groups of WAL
    # entries; 1 writes what kwal wrote before version 2 existed (tests of old records)
    record_version: int = RECORD_LATEST


class GroupWriter:
    """Issues groups of entries as WAL records and acknowledges them in LSN order."""

    def __init__(
        self,
        producer: Producer | TxnChannel,
        topic: str,
        partitions: Sequence[int],
        epoch: int,
        writer_id: str,
        acked: int,
        settings: WriterSettings,
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._partitions = list(partitions)
        self._epoch = epoch
        self._writer_id = writer_id
        self._s = settings
        self._lock = threading.Lock()  # not reentrant: cheaper
        self._cond = threading.Condition(self._lock)
        self._window = Window(settings.window, acked)
        self._next = acked + 1
        self._group: list[bytes] = []
        self._group_first = acked + 1
        self._group_bytes = 0
        self._in_flight = 0
        self._rr = 0
        self._failed: BaseException | None = None
        self._closed = False
        self.reissued = 0  # records issued again after a delivery without an offset
        # The (partition, offset) <-> LSN map of this writer's durable records.
        self.records: list[RecordInfo] = []
        self.segments: list[Segment] = []  # sorted by first
        self._next_tick = 0.0
        self._batches: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
        self._completer_open = True  # under _cond
        self._completer = threading.Thread(
            target=self._complete_loop, name="kwal-wal-complete", daemon=True
        )
        self._completer.start()

    # -- state ---------------------------------------------------------------

    @property
    def acked(self) -> int:
        with self._cond:
            return self._window.acked

    @property
    def next_lsn(self) -> int:
        with self._cond:
            return self._next

    @property
    def failure(self) -> BaseException | None:
        return self._failed

    def lock(self) -> threading.Condition:
        return self._cond

    # -- append --------------------------------------------------------------

    def append(self, lsn: int, payload: bytes) -> Future[int]:
        future: Future[int] = AckFuture()
        with self._lock:  # the condition's own lock: `with self._cond` adds two Python calls
            # 1. refuse on failure / close
            if self._closed:
                future.set_exception(LogClosedError("Kafka WAL driver is closed"))
                return future
            if self._failed is not None:
                future.set_exception(self._failed)
                return future
            if lsn != self._next:
                raise ValueError(f"append of LSN {lsn}, expected {self._next}")
            # 2. the window
            if not self._window.room_for(lsn):
                self._wait_for_room_locked(lsn)
                if self._closed or self._failed is not None:
                    future.set_exception(
                        self._failed or LogClosedError("Kafka WAL driver is closed")
                    )
                    return future
            # 3. join the open group
            self._group.append(payload)
            self._group_bytes += len(payload) + FRAME_OVERHEAD
            self._window.admit(lsn, future, time.monotonic())
            self._next = lsn + 1
            # 4. issue when full or when a record slot is free
            issue = self._take_group_locked() if self._group_ready_locked() else None
            kick = self._s.kick is not None and issue is None and len(self._group) == 1
        if issue is not None:
            self._produce(issue)
        elif kick:
            assert self._s.kick is not None
            self._s.kick()
        return future

    def issue_open_group(self) -> None:
        """The bus starts a transaction: the open group goes into it as one record."""
        with self._lock:
            issue = self._take_group_locked() if not self._closed else None
        if issue is not None:
            self._produce(issue)

    def _wait_for_room_locked(self, lsn: int) -> None:
        """Step 2: wait, bounded, until the window has room for `lsn`, the writer fails or
        it closes."""
        deadline = time.monotonic() + self._s.append_timeout_s
        while not self._window.room_for(lsn) and self._failed is None and not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WindowTimeoutError(
                    f"append of LSN {lsn} waited {self._s.append_timeout_s:.1f}s for the "
                    f"window: LSN {self._window.acked + 1} is still unacknowledged and the "
                    f"window is {self._window.size}"
                )
            self._cond.wait(left)

    def _group_ready_locked(self) -> bool:
        """Issue the open group now? Full groups always go; otherwise a free record slot is
        taken only by a group of at least GROWTH ** in_flight entries: an idle writer sends a
        lone entry at once, a busy one sends fewer, fuller records (several still in flight)."""
        n = len(self._group)
        if n >= self._s.group_max_entries or self._group_bytes >= self._s.group_max_bytes:
            return True
        if self._s.kick is not None:
            return False  # pulled by the bus (`issue_open_group`)
        return self._in_flight < self._s.max_in_flight and n >= GROWTH**self._in_flight

    def _take_group_locked(self) -> _Issue | None:
        """Close the open group as the next record (under the lock); `_produce` sends it."""
        if not self._group or self._failed is not None:
            return None
        first, payloads = self._group_first, self._group
        self._group = []
        self._group_bytes = 0
        self._group_first = first + len(payloads)
        partition = self._partitions[self._rr % len(self._partitions)]
        self._rr += 1
        self._in_flight += 1
        return first, payloads, partition, self._window.acked

    def _produce(self, issue: _Issue) -> None:
        """Encode and produce a record, outside the lock (records may be produced in any
        order: the window orders acknowledgements)."""
        first, payloads, partition, acked = issue
        count = len(payloads)
        try:
            value, version = encode_value(payloads, self._s.record_version, first)
            headers = entries_headers(self._epoch, first, count, acked, self._writer_id, version)
            size = len(value)

            def on_delivery(err: KafkaError | None, msg: Message) -> None:
                self._delivered(err, msg, issue, size)

            self._producer.produce(
                self._topic,
                value=value,
                partition=partition,
                headers=headers,
                on_delivery=on_delivery,
            )
        except Exception as e:  # any encode or produce failure (BufferError, KafkaException, ...) fails the writer
            with self._cond:
                self._in_flight -= 1
                self._fail_locked(
                    AppendFailedError(f"cannot produce WAL record at LSN {first}: {e}")
                )

    # -- delivery and completion ---------------------------------------------

    def _delivered(self, err: KafkaError | None, msg: Message, issue: _Issue, size: int) -> None:
        first, payloads, partition, _ = issue
        last = first + len(payloads) - 1
        off = -1 if err is not None else msg.offset()
        if off is None:  # no proof of durability (module docstring)
            self._reissue(issue)
            return
        with self._cond:
            self._in_flight -= 1
            if err is not None:
                self._fail_locked(
                    AppendFailedError(f"WAL record LSN {first}..{last} was not made durable: {err}")
                )
                return
            if self._failed is not None:
                return
            p = int(msg.partition() or 0)
            _, ts = msg.timestamp()
            self.records.append(RecordInfo(p, off, last, int(ts), size))
            bisect.insort(self.segments, Segment(first, last, p, off, 0), key=lambda s: s.first)
            done = self._window.durable(first, last)
            if done:
                self._complete_locked(done, None)
            nxt = self._take_group_locked() if self._group_ready_locked() else None
            self._cond.notify_all()
        if nxt is not None:
            self._produce(nxt)

    def _reissue(self, issue: _Issue) -> None:
        """Issue a record's entries again, on its partition, with the acked LSN of now (the
        record that replaces it stays in flight: `_in_flight` is unchanged)."""
        first, payloads, partition, _ = issue
        with self._cond:
            if self._failed is not None:
                self._in_flight -= 1
                return
            self.reissued += 1
            again = (first, payloads, partition, self._window.acked)
        log.warning(
            "WAL record LSN %d..%d: the broker acknowledged it without an offset (a duplicate "
            "sequence answer), which does not prove it was written; issuing it again",
            first,
            first + len(payloads) - 1,
        )
        self._produce(again)

    def _complete_locked(
        self, futures: list[tuple[int, Future[int]]], exc: BaseException | None
    ) -> None:
        """Queue a batch for the completion thread (under _cond: batches keep LSN order).
        No batch comes after `close` (it fails what is pending before it stops the thread);
        were one to, it is completed here rather than lost."""
        if self._completer_open:
            self._batches.put((futures, exc))
        else:
            _complete(futures, exc)

    def _complete_loop(self) -> None:
        """The completion thread: completes batches in the order they were queued."""
        while True:
            batch = self._batches.get()
            if batch is None:
                return
            _complete(*batch)

    def _fail_locked(self, exc: BaseException) -> None:
        if self._failed is None:
            self._failed = exc
        self._group = []
        self._group_bytes = 0
        failed = self._window.fail_all()
        if failed:
            self._complete_locked(failed, self._failed)
        self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self._cond:
            self._fail_locked(exc)

    def tick(self) -> None:
        """Watchdog (pump thread): fail when the oldest entry waits past append_timeout_s."""
        now = time.monotonic()
        if now < self._next_tick:
            return
        self._next_tick = now + 0.05
        with self._cond:
            since = self._window.oldest_pending_since()
            if since is not None and time.monotonic() - since > self._s.append_timeout_s:
                self._fail_locked(
                    AppendTimeoutError(
                        f"LSN {self._window.acked + 1} was not acknowledged by the broker within "
                        f"{self._s.append_timeout_s:.1f}s (broker lost?); it and every later "
                        "entry are not acknowledged"
                    )
                )

    # -- close ---------------------------------------------------------------

    def close(self, timeout_s: float) -> None:
        """Issue what is open, wait (bounded) for acknowledgements, fail the rest."""
        with self._cond:
            issue = None if self._closed else self._take_group_locked()
        if issue is not None:
            self._produce(issue)
        with self._cond:
            if not self._closed:
                deadline = time.monotonic() + timeout_s
                while self._window.pending() and self._failed is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(min(left, 0.1))
                self._closed = True
                if self._window.pending():
                    self._fail_locked(
                        LogClosedError("Kafka WAL driver closed before the entry was acknowledged")
                    )
                self._cond.notify_all()
        with self._cond:
            self._completer_open = False
        self._batches.put(None)
        if threading.current_thread() is not self._completer:
            self._completer.join(timeout_s)


def _complete(futures: list[tuple[int, Future[int]]], exc: BaseException | None) -> None:
    """Complete futures in order: with their LSN, or with `exc`. Done-callbacks run here;
    one that raises is logged, like `Future` does, and the rest still complete."""
    if exc is None:
        set_results([(fut, lsn) for lsn, fut in futures])
        return
    for _, fut in futures:
        if not fut.done():
            fut.set_exception(exc)
