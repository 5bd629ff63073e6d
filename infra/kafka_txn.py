"""`TxnBus`: everything a TN writes goes through ONE transactional producer (KIP-98 fencing).

Why (docs/fencing.md): a TN that was paused (GC, SIGSTOP, a partition) while a
second TN took its WAL over must never get anything accepted afterwards, nor
acknowledge a commit the new TN does not replay. The broker does that for a
`transactional.id`: `init_transactions` by a new instance bumps the producer
epoch, aborts the old instance's open transaction and refuses every later
write or commit of the old one (fatal `_FENCED`). So the TN's WAL records,
meta records, results and logtail records are all produced by one producer
whose `transactional.id` is bound to the WAL (`<prefix>.tn`), and every
reader reads `read_committed`.

How it runs, numbered as the bus thread does it:

1. the constructor calls `init_transactions`: this IS the fence; it returns once
   every transaction of an older instance is committed or aborted;
2. components produce through `channel()`s (a Producer-like facade each: produce,
   poll, flush); `produce` only queues;
3. the bus thread takes everything queued (one batch), begins a transaction,
   produces the batch, flushes it and commits the transaction. While a commit
   is under way, new records queue up and make the next batch: the per-
   transaction cost (AddPartitions, EndTxn, the markers) is amortised over
   a batch that grows with the load (group commit, one level up). A *source*
   (the WAL writer) does not queue records itself: it `kick`s the bus when it
   has something, and the bus, right before it takes a batch, asks every source
   to produce what it holds, so each transaction carries ONE WAL record with
   every entry appended since the previous one;
4. only once `commit_transaction` returned are the records' delivery callbacks
   handed to their channel, which runs them at its next `poll`/`flush`: a
   component never learns "delivered" for a record that is not committed;
5. an abortable error aborts the transaction: its records get the error (they
   were not committed) and the bus goes on; a fatal one (fenced by a newer
   instance, or any other) fails the bus: the `on_failed` hooks run once, the
   batch in flight gets the error (its outcome is unknown when the commit
   itself failed) and every queued and later record gets it too (never sent:
   not committed).

One transaction is open at a time and none is long-lived (DESIGN.md): a frozen
TN's open transaction is aborted by the next instance's `init_transactions`,
or by the broker after `transaction.timeout.ms`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

log = logging.getLogger(__name__)

DeliveryCallback = Callable[[KafkaError | None, Any], None]

FENCED_CODES = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


def is_fenced(err: KafkaError | None) -> bool:
    """Was this error the broker fencing the producer (a newer instance of its id)?"""
    return err is not None and err.code() in FENCED_CODES


def fatal_cause(producer: Producer, err: KafkaError, timeout_s: float) -> KafkaError:
    """The error that made a transactional producer fatal, for an error that only says so.

    Why: `produce` on a producer librdkafka has already declared fatal raises `_FATAL`
    ("Unable to produce message: Local: Fatal error"), not flagged fatal and without the
    cause, while the transactional API raises the cause itself (`_FENCED` when a newer
    instance fenced this one). A TN resumed after a freeze took its fencing for another
    fatal error, reopened its log, and so fenced the TN that had taken over (CI run v5,
    tests/faults/test_split_brain.py). Any other error is returned as it is."""
    if err.code() != KafkaError._FATAL:
        return err
    try:
        producer.abort_transaction(timeout_s)
    except KafkaException as e:
        inner = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
        if inner is not None and inner.fatal():
            return inner
    return KafkaError(KafkaError._FATAL, err.str(), fatal=True)


@dataclass
class Unsent:
    """Stands in for a delivery report's message when a record was never delivered."""

    _topic: str
    _partition: int | None
    _key: bytes | None
    _value: bytes | None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int | None:
        return self._partition

    def offset(self) -> int | None:
        return None

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value


@dataclass
class _Record:
    channel: TxnChannel
    topic: str
    value: bytes | None
    key: bytes | None
    partition: int | None
    headers: Any
    on_delivery: DeliveryCallback | None
    report: tuple[KafkaError | None, Any] | None = field(default=None)

    def unsent(self) -> Unsent:
        return Unsent(self.topic, self.partition, self.key, self.value)


class TxnBus:
    """One transactional producer, shared by a TN's components (see the module docstring)."""

    def __init__(
        self, conf: dict[str, Any], transactional_id: str, timeout_s: float, name: str = "kwal-txn"
    ) -> None:
        self.transactional_id = transactional_id
        self._timeout_s = timeout_s
        conf = dict(conf)
        conf.update(
            {
                "transactional.id": transactional_id,
                "enable.idempotence": True,
                "acks": "all",
                # how long a frozen instance's open transaction may hold read_committed
                # readers back when no newer instance comes to abort it
                "transaction.timeout.ms": max(10_000, int(conf.get("message.timeout.ms", 0))),
            }
        )
        self._producer = Producer(conf)
        # 1. the fence
        self._producer.init_transactions(timeout_s)
        log.info("transactional.id %s initialised: every older instance is fenced", transactional_id)
        self._cond = threading.Condition()
        self._queue: list[_Record] = []
        self._failed: KafkaError | None = None
        self._on_failed: list[Callable[[KafkaError], None]] = []
        self._closing = False
        self._kicked = False
        self._sources: list[Callable[[], None]] = []
        self.transactions = 0  # committed transactions (metrics, benchmarks)
        self.records = 0  # records committed
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- components' side ----------------------------------------------------------------

    def channel(self) -> TxnChannel:
        return TxnChannel(self)

    @property
    def failure(self) -> KafkaError | None:
        return self._failed

    def add_on_failed(self, fn: Callable[[KafkaError], None]) -> None:
        """Call fn(error) once the bus fails (at once if it already has)."""
        with self._cond:
            failed = self._failed
            if failed is None:
                self._on_failed.append(fn)
        if failed is not None:
            fn(failed)

    def add_source(self, fn: Callable[[], None]) -> None:
        """fn() runs on the bus thread right before each batch is taken (step 3): it
        produces what it holds through a channel."""
        self._sources.append(fn)

    def kick(self) -> None:
        """A source has something: start a transaction when none is running."""
        with self._cond:
            self._kicked = True
            self._cond.notify_all()

    def _enqueue(self, rec: _Record) -> None:
        with self._cond:
            failed = self._failed if self._failed is not None else None
            if failed is None and self._closing:
                failed = KafkaError(KafkaError._DESTROY, "the transactional producer is closed")
            if failed is None:
                self._queue.append(rec)
                self._cond.notify_all()
                return
        rec.channel._report(rec, failed, rec.unsent())

    def close(self, timeout_s: float) -> None:
        """Commit what is queued (bounded), then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout_s)

    # -- the bus thread --------------------------------------------------------------------

    def _take(self) -> list[_Record] | None:
        with self._cond:
            while not self._queue and not self._kicked and not self._closing:
                self._cond.wait(0.5)
            self._kicked = False
        for fn in self._sources:
            try:
                fn()
            except Exception:  # noqa: BLE001 - a source's bug must not stop the bus
                log.exception("%s: a source failed", self.transactional_id)
        with self._cond:
            if not self._queue:
                return None if self._closing else []
            batch, self._queue = self._queue, []
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            if not batch:
                continue
            if self._failed is not None:
                self._fail_records(batch, self._failed)
                continue
            self._transact(batch)

    def _transact(self, batch: list[_Record]) -> None:
        """Steps 3-5 for one batch."""
        p = self._producer
        try:
            p.begin_transaction()
            for rec in batch:
                self._produce(rec)
            left = p.flush(self._timeout_s)
            if left:
                raise KafkaException(
                    KafkaError(
                        KafkaError._TIMED_OUT,
                        f"{left} records were not acknowledged within {self._timeout_s:.1f}s",
                        fatal=True,
                    )
                )
            errors = [r.report[0] for r in batch if r.report is not None and r.report[0]]
            if errors:
                raise KafkaException(errors[0])
            self._commit()
        except KafkaException as e:
            err: KafkaError = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else (
                KafkaError(KafkaError._FAIL, str(e), fatal=True)
            )
            err = fatal_cause(p, err, self._timeout_s)
            if err.txn_requires_abort() and not err.fatal():
                self._abort(batch, err)
            else:
                self._fail(err)
                self._fail_records(batch, err)
            return
        self.transactions += 1
        self.records += len(batch)
        for rec in batch:
            assert rec.report is not None
            rec.channel._report(rec, None, rec.report[1])

    def _produce(self, rec: _Record) -> None:
        def on_delivery(err: KafkaError | None, msg: Any, rec: _Record = rec) -> None:
            rec.report = (err, msg)

        kwargs: dict[str, Any] = {"value": rec.value, "on_delivery": on_delivery}
        if rec.key is not None:
            kwargs["key"] = rec.key
        if rec.partition is not None:
            kwargs["partition"] = rec.partition
        if rec.headers:
            kwargs["headers"] = rec.headers
        while True:
            try:
                self._producer.produce(rec.topic, **kwargs)
                return
            except BufferError:
                self._producer.poll(0.01)

    def _commit(self) -> None:
        """commit_transaction, again while the error says retriable (bounded)."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                self._producer.commit_transaction(max(0.1, deadline - time.monotonic()))
                return
            except KafkaException as e:
                err = e.args[0] if e.args else None
                if (
                    isinstance(err, KafkaError)
                    and err.retriable()
                    and not err.fatal()
                    and time.monotonic() < deadline
                ):
                    continue
                raise

    def _abort(self, batch: list[_Record], err: KafkaError) -> None:
        log.warning("%s: transaction aborted (%s); its records were not committed", self.transactional_id, err)
        try:
            self._producer.abort_transaction(self._timeout_s)
        except KafkaException as e:
            inner = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else err
            self._fail(inner)
        self._fail_records(batch, err)

    def _fail(self, err: KafkaError) -> None:
        with self._cond:
            if self._failed is not None:
                return
            self._failed = err
            hooks, self._on_failed = self._on_failed, []
            queued, self._queue = self._queue, []
        if is_fenced(err):
            log.error(
                "%s: fenced by a newer instance of the same transactional.id: nothing this "
                "process writes is accepted any more (%s)",
                self.transactional_id,
                err,
            )
        else:
            log.error("%s: the transactional producer failed: %s", self.transactional_id, err)
        for fn in hooks:
            try:
                fn(err)
            except Exception:  # noqa: BLE001 - every hook runs
                log.exception("on_failed hook")
        self._fail_records(queued, err)

    @staticmethod
    def _fail_records(records: list[_Record], err: KafkaError) -> None:
        for rec in records:
            rec.channel._report(rec, err, rec.unsent())


class TxnChannel:
    """A component's Producer-like view of the bus: `produce` queues a record for the next
    transaction; its delivery callback runs at this channel's `poll`/`flush`, after the
    transaction committed (or with the error that kept it from committing)."""

    def __init__(self, bus: TxnBus) -> None:
        self.bus = bus
        self._ready: queue.SimpleQueue[tuple[_Record, KafkaError | None, Any]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._outstanding = 0  # produced, callback not yet run

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        on_delivery: DeliveryCallback | None = None,
        headers: Any = None,
    ) -> None:
        with self._lock:
            self._outstanding += 1
        self.bus._enqueue(_Record(self, topic, value, key, partition, headers, on_delivery))

    def _report(self, rec: _Record, err: KafkaError | None, msg: Any) -> None:
        self._ready.put((rec, err, msg))

    def poll(self, timeout: float = 0.0) -> int:
        """Run the delivery callbacks that are ready, waiting up to `timeout` for the first."""
        try:
            first = self._ready.get(timeout=timeout) if timeout > 0 else self._ready.get_nowait()
        except queue.Empty:
            return 0
        n = 0
        item: tuple[_Record, KafkaError | None, Any] | None = first
        while item is not None:
            rec, err, msg = item
            with self._lock:
                self._outstanding -= 1
            if rec.on_delivery is not None:
                rec.on_delivery(err, msg)
            n += 1
            try:
                item = self._ready.get_nowait()
            except queue.Empty:
                item = None
        return n

    def flush(self, timeout: float | None = None) -> int:
        """Run callbacks until every record produced so far had its own; the number left."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self._outstanding <= 0:
                    return 0
            left = 0.1 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                with self._lock:
                    return self._outstanding
            self.poll(min(left, 0.1))

    def __len__(self) -> int:
        with self._lock:
            return self._outstanding

    def __bool__(self) -> bool:
        """A channel is always truthy: `__len__` counts the records not yet reported, and
        a caller's `producer or Producer(...)` must never take an idle channel for no
        producer (that sent the TN's results and logtail around the bus, unfenced)."""
        return True
