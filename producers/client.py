"""The producers client: send transactions to the TN over Kafka and await results.

    client = Client(cfg)                       # one per service is plenty
    txn = client.begin()
    txn.create_table("shop.orders", [("id", "int64"), ("amount", "float64")], "id")
    txn.insert("shop.orders", [{"id": 1, "amount": 9.5}])
    result = txn.commit(timeout=10)            # CommitResult(commit_ts, request_id)
    future = other_txn.commit_async()          # Future[CommitResult]
    txn.commit(request_id=rid)                 # a retry: the TN runs an id once (docs/retries.md)

How results come back: one record per result, or -- since every request of this
client carries the header ``kwal-results: batch`` -- one record holding several
results of the same client (the TN packs what it has ready); the reader settles a
record's futures taking its lock once. Every Client in a process shares (per bootstrap and
results topic) ONE Kafka producer and ONE results reader thread. The reader
`assign()`s the results topic's partitions at their high watermark read
*when the reader starts*, before any request of this process is sent. The
embedded broker's reported high watermark can lag the true end, never lead
it, so starting there can only re-read some older results, never miss a new
one; results whose request id this process did not issue (or gave up
waiting for) are ignored. A request's future is registered before the
request is produced, so a result can never arrive unrouted.

Request ids are uuid4 hex strings unless the caller names one (`commit(request_id=...)`,
to retry after a timeout or a restart of its own); the TN runs an id once and answers
every copy with the first outcome (docs/retries.md).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from infra.config import ConfigError, KwalConfig
from infra.kafka_io import FETCH_WAIT_MS, poll_batch
from infra.metrics import METRICS
from infra.objectstore import ObjectStore, open_store
from infra.principals import client_principal, requests_topic, results_topic
from infra.queues import drain
from infra.reader_stall import LOST_AFTER, StallWatch, has_records
from infra.stack import apply_stack
from producers.exceptions import (
    AbortedError,
    ClientClosedError,
    ConflictError,
    ProducerError,
    TimeoutError,
    ValidationError,
    error_for,
)
from producers.rows import Rows, to_arrow
from producers.spill import check_size, discard, needs_spill, spill
from schemas.requests import (
    RESULTS_BATCH,
    RESULTS_HEADER,
    Column,
    OpKind,
    TxnOp,
    TxnRequest,
    decode_results,
    encode_request,
)

log = logging.getLogger(__name__)

# delivery reports of requests purged from a replaced producer (`_SharedProducer` step 3)
_PURGED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)


@dataclass(frozen=True, slots=True)
class CommitResult:
    commit_ts: int
    request_id: str


# This client reads result batches: the TN may answer several of its requests in one
# `txn_result_batch` record (schemas.requests); without the header it answers each alone.
_REQUEST_HEADERS: list[tuple[str, str | bytes | None]] = [(RESULTS_HEADER, RESULTS_BATCH)]

MAX_REQUEST_ID_BYTES = 256  # the TN reads an id back from a body it cannot decode up to this


# uuid4's version (4) and variant (RFC 4122) bits, set in 128 random bits
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (4 << 76) | (0x8000 << 48)


def new_request_id() -> str:
    """A fresh request id (what a transaction gets unless the caller names one): the hex
    of a random uuid4, as ``uuid.uuid4().hex``, without building a `uuid.UUID` (a third
    of the cost: it is paid once per commit)."""
    return f"{int.from_bytes(os.urandom(16), 'big') & _UUID4_CLEAR | _UUID4_SET:032x}"


def check_request_id(request_id: object) -> str:
    """A caller's request id, or ValidationError naming what is wrong with it: a non-empty
    string of at most MAX_REQUEST_ID_BYTES UTF-8 bytes, not starting with '@' (the TN
    names undecodable requests '@<partition>:<offset>')."""
    if not isinstance(request_id, str) or not request_id:
        raise ValidationError(
            f"request_id must be a non-empty string, got {request_id!r}", code="bad_request_id"
        )
    if len(request_id.encode("utf-8")) > MAX_REQUEST_ID_BYTES:
        raise ValidationError(
            f"request_id is {len(request_id.encode('utf-8'))} bytes; at most {MAX_REQUEST_ID_BYTES}",
            code="bad_request_id",
        )
    if request_id.startswith("@"):
        raise ValidationError(
            f"request_id {request_id!r} starts with '@', which names undecodable requests",
            code="bad_request_id",
        )
    return request_id


def split_table(name: str) -> tuple[str, str]:
    database, dot, table = name.partition(".")
    if not dot or not database or not table:
        raise ValueError(f"table must be named 'database.table', got {name!r}")
    return database, table


# ---- process-wide Kafka plumbing ------------------------------------------------------------


def client_producer_conf(cfg: KwalConfig) -> dict[str, Any]:
    """The requests producer's settings (one producer per process, shared by its Clients)."""
    return cfg.kafka_client(
        **{
            "linger.ms": 2,
            "acks": "all",
            "enable.idempotence": True,
            "queue.buffering.max.messages": 200_000,
            "message.max.bytes": cfg.max_record_bytes,
        }
    )


def results_reader_conf(cfg: KwalConfig) -> dict[str, Any]:
    """The results reader's settings (assigned at the end, never committed)."""
    return cfg.kafka_client(
        **{
            "group.id": f"kwal-producers-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            "fetch.min.bytes": 1,
            "enable.partition.eof": False,
            # a result a replaced (fenced) TN wrote after its fence is aborted: never seen
            "isolation.level": "read_committed",
        }
    )


class _SharedProducer:
    """One producer per (Kafka settings) per process, with a poll thread.

    Sends that must be made again (a request acknowledged without an offset, or purged
    from a replaced producer) are queued by the delivery callback with `again` and made
    by the poll thread after its poll returns: never inside a callback, where a full
    producer queue could only wait on the very thread that serves the reports which
    would empty it.

    A producer that lost its brokers for good is replaced. librdkafka can drop every
    broker it knows when a restarting Kafka node answers Metadata with an empty broker
    list, and never bootstrap again (librdkafka issue 5301; `infra.reader_stall` step 5
    does the same for the readers):
    1. while requests wait undelivered and no delivery report came for `check_s`, the
       poll thread asks the producer for metadata (a check);
    2. `LOST_AFTER` failed checks in a row make a new producer with the same settings;
       every Client sends through it from then on (`produce` takes the current one, under
       the lock the swap takes: nothing is produced into a purged producer);
    3. the old producer's queued and in-flight requests are purged: each one's delivery
       report (`_PURGE_QUEUE`, `_PURGE_INFLIGHT`) sends it again through the new producer.
       A request that had reached the broker is then there twice: the TN runs a request
       id once and answers every copy with the same outcome (docs/retries.md)."""

    _lock = threading.Lock()
    _instances: dict[tuple[tuple[str, str], ...], _SharedProducer] = {}

    def __init__(self, conf: dict[str, Any], check_s: float) -> None:
        if not check_s > 0:
            raise ConfigError(f"client.producer_check_s must be > 0 seconds, got {check_s}")
        self._conf = conf
        self.producer = Producer(conf)
        self._swap_lock = threading.Lock()  # `produce` and the swap in `_replace` (step 2)
        self._check_s = check_s
        self._failed_checks = 0  # in a row (step 2)
        self._reports = 0  # delivery reports served (`report`): progress for step 1
        self._again: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._again_pending = 0  # queued or being made; under _again_lock
        self._again_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="kwal-producer-poll", daemon=True)
        self._thread.start()

    def report(self) -> None:
        """A delivery report was served (each delivery callback says so: librdkafka's
        own error events also count as served by `poll`, and are no progress)."""
        self._reports += 1

    def _poll(self) -> None:
        last_progress = time.monotonic()
        reports = self._reports
        while not self._stop.is_set():
            self.producer.poll(0.05)
            self.run_again()
            now = time.monotonic()
            if self._reports != reports or not len(self.producer):
                reports = self._reports
                last_progress = now
            elif now - last_progress >= self._check_s:  # step 1
                last_progress = now
                self._check()

    def _check(self) -> None:
        """Steps 1-3 once: does the producer reach a broker? It is replaced after
        `LOST_AFTER` failed checks in a row."""
        try:
            reached = bool(self.producer.list_topics(timeout=min(2.0, self._check_s)).brokers)
        except Exception as e:  # noqa: BLE001 - the broker may be away: counted below
            log.debug("requests producer check: %s", e)
            reached = False
        if reached:
            self._failed_checks = 0
            return
        self._failed_checks += 1
        if self._failed_checks >= LOST_AFTER:
            self._replace()

    def _replace(self) -> None:
        """Steps 2-3."""
        log.warning(
            "requests producer: %d checks in a row reached no broker while requests wait "
            "undelivered; replacing it with a new one and sending them again",
            self._failed_checks,
        )
        self._failed_checks = 0
        METRICS.producer_replaced.inc()
        fresh = Producer(self._conf)
        with self._swap_lock:
            old, self.producer = self.producer, fresh
        old.purge(in_queue=True, in_flight=True, blocking=True)
        # the purged requests' reports, each queueing its send again (step 3); bounded: a
        # client without brokers may keep raising error events of its own
        for _ in range(1000):
            if not old.poll(0):
                break

    def produce(self, topic: str, **kwargs: Any) -> None:
        """Producer.produce on the current producer (BufferError when its queue is full)."""
        with self._swap_lock:
            self.producer.produce(topic, **kwargs)

    def again(self, send: Callable[[], None]) -> None:
        """Queue a send for the poll thread (safe inside a delivery callback)."""
        with self._again_lock:
            self._again_pending += 1
        self._again.put(send)

    def run_again(self) -> None:
        for send in drain(self._again):
            try:
                send()
            finally:
                with self._again_lock:
                    self._again_pending -= 1

    def flush(self, timeout: float) -> int:
        """Like Producer.flush, counting the sends queued with `again` as not delivered."""
        deadline = time.monotonic() + timeout
        while True:
            self.producer.flush(max(0.0, deadline - time.monotonic()))
            self.run_again()
            with self._again_lock:
                left = self._again_pending + len(self.producer)
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.005)

    @classmethod
    def get(cls, cfg: KwalConfig) -> _SharedProducer:
        conf = client_producer_conf(cfg)
        key = tuple(sorted((str(k), str(v)) for k, v in conf.items()))
        with cls._lock:
            inst = cls._instances.get(key)
            if inst is None:
                inst = cls._instances[key] = cls(conf, cfg.client.producer_check_s)
            return inst


class _ResultRouter:
    """The results reader shared by every Client on the same topic and cluster."""

    _lock = threading.Lock()
    _instances: dict[tuple[str, str], _ResultRouter] = {}

    def __init__(self, cfg: KwalConfig, topic: str, timeout_s: float) -> None:
        self.topic = topic
        self._key = (cfg.bootstrap, topic)
        # request id -> the futures waiting for its result (one per send of the id)
        self._pending: dict[str, list[Future[CommitResult]]] = {}
        self._plock = threading.Lock()
        self._refs = 0
        self._stop = threading.Event()

        def new_consumer() -> Consumer:  # at start, and in place of a lost one
            return Consumer(results_reader_conf(cfg))

        self._stall = StallWatch(
            "results", cfg.client.results_stall_s, "client.results_stall_s", new_consumer
        )
        self._consumer = new_consumer()
        start = self._end_positions(timeout_s)
        # (topic, partition) -> one past the last result record read: where a reader that
        # stopped fetching is assigned again (`infra.reader_stall`)
        self._positions = {(tp.topic, tp.partition): tp.offset for tp in start}
        self._consumer.assign(start)
        self._thread = threading.Thread(target=self._run, name="kwal-results", daemon=True)
        self._thread.start()

    def _end_positions(self, timeout_s: float) -> list[TopicPartition]:
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                md = self._consumer.list_topics(
                    self.topic, timeout=max(0.5, deadline - time.monotonic())
                )
                t = md.topics.get(self.topic)
                if t is None or t.error is not None or not t.partitions:
                    raise ProducerError(
                        f"results topic {self.topic} does not exist", code="no_topic"
                    )
                out = []
                for p in sorted(t.partitions):
                    _, high = self._consumer.get_watermark_offsets(
                        TopicPartition(self.topic, p), timeout=max(0.5, deadline - time.monotonic())
                    )
                    out.append(TopicPartition(self.topic, p, max(0, high)))
                return out
            except Exception as e:  # topic not there yet, broker starting
                last = e
                time.sleep(0.2)
        raise ProducerError(f"cannot read the results topic {self.topic}: {last}", code="no_topic")

    @classmethod
    def acquire(cls, cfg: KwalConfig, timeout_s: float) -> _ResultRouter:
        topic = results_topic(cfg)
        key = (cfg.bootstrap, topic)
        with cls._lock:
            inst = cls._instances.get(key)
            if inst is None or inst._stop.is_set():
                inst = cls._instances[key] = cls(cfg, topic, timeout_s)
            inst._refs += 1
            return inst

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            if self._refs > 0:
                return
            self._stop.set()
            if self._instances.get(self._key) is self:
                del self._instances[self._key]
        self._thread.join(timeout=5)
        self._consumer.close()
        with self._plock:
            pending, self._pending = self._pending, {}
        for futs in pending.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(ClientClosedError("client closed before the result arrived"))

    def register(self, request_id: str) -> Future[CommitResult]:
        """A future for the next result of `request_id`. An id sent again while an earlier
        send still waits gets a future of its own: the TN answers every copy, and the
        first answer settles both."""
        fut: Future[CommitResult] = Future()
        with self._plock:
            self._pending.setdefault(request_id, []).append(fut)
        return fut

    def forget(self, request_id: str, fut: Future[CommitResult]) -> None:
        with self._plock:
            futs = self._pending.get(request_id)
            if futs is not None and fut in futs:
                futs.remove(fut)
                if not futs:
                    del self._pending[request_id]

    def fail(self, request_id: str, fut: Future[CommitResult], error: ProducerError) -> None:
        self.forget(request_id, fut)
        if not fut.done():
            fut.set_exception(error)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msgs = poll_batch(self._consumer, 1000, 0.1)
            except Exception:  # consumer closed under us, broker gone
                if self._stop.is_set():
                    return
                time.sleep(0.1)
                continue
            # a stalled results reader (`infra.reader_stall`) is assigned again at the
            # record after the last it read: no result is missed
            if self._stall.polled(has_records(msgs)):
                self._consumer = self._stall.unstick(self._consumer, self._positions)
            for msg in msgs:
                if msg.error() is not None:
                    continue
                self._positions[(msg.topic(), msg.partition())] = msg.offset() + 1
                self._route(msg.value())

    def _route(self, value: bytes | None) -> None:
        """Settle the futures of the results in one record (one result, or a batch of
        one client's: `schemas.requests.decode_results`), taking the lock once."""
        if not value:
            return
        try:
            results = decode_results(value)
        except Exception:
            return  # not ours to judge; a result we cannot read routes nowhere
        with self._plock:
            pop = self._pending.pop
            routed = [(res, pop(res.request_id, None)) for res in results]
        for res, futs in routed:
            if not futs:
                continue
            for fut in futs:
                if fut.done():
                    continue
                if res.committed:
                    fut.set_result(CommitResult(res.commit_ts, res.request_id))
                else:
                    fut.set_exception(
                        error_for(res.kind.value, res.reason, res.message, res.request_id)
                    )


# ---- the public API ------------------------------------------------------------------------


class Client:
    """A producer of transactions. Thread-safe: many transactions may be built
    and committed concurrently from many threads."""

    def __init__(
        self,
        cfg: KwalConfig,
        client_id: str | None = None,
        *,
        start_timeout_s: float = 15.0,
        store: ObjectStore | None = None,
    ) -> None:
        """`store`: where large transactions' rows go (producers.spill); default: the
        config's object store (`[objectstore]`, the TN's), opened when first needed."""
        # Like the command line: a config that names no Kafka address (no file, no
        # KWAL_BOOTSTRAP, no with_bootstrap) uses the running `kwal up` stack's.
        cfg = apply_stack(cfg, explicit_bootstrap=cfg.bootstrap_explicit)
        self.cfg = cfg
        # secure mode (docs/security.md): requests go to this principal's own topic, and
        # the TN refuses a client id other than the principal
        self.requests_topic = requests_topic(cfg)
        default_id = client_principal(cfg) if cfg.security.enabled else f"client-{uuid.uuid4().hex[:12]}"
        self.client_id = client_id or default_id
        self._shared = _SharedProducer.get(cfg)
        self._router = _ResultRouter.acquire(cfg, start_timeout_s)
        self._closed = False
        self._store = store
        self._store_lock = threading.Lock()

    def object_store(self) -> ObjectStore:
        with self._store_lock:
            if self._store is None:
                self._store = open_store(self.cfg.objectstore)
            return self._store

    def begin(self) -> Transaction:
        if self._closed:
            raise ClientClosedError("client is closed")
        return Transaction(self)

    def _send(self, req: TxnRequest) -> Future[CommitResult]:
        if self._closed:
            raise ClientClosedError("client is closed")
        payload = encode_request(req)
        limit = self.cfg.tn.max_request_bytes
        if len(payload) > limit:
            raise ValidationError(
                f"transaction {req.request_id} is {len(payload)} bytes encoded, above "
                f"tn.max_request_bytes={limit}: split it into smaller transactions",
                code="oversized",
                request_id=req.request_id,
            )
        fut = self._router.register(req.request_id)
        router = self._router
        rid = req.request_id

        def delivered(err: Any, msg: Any) -> None:
            self._shared.report()
            if err is not None and err.code() in _PURGED:
                # purged from a producer that lost its brokers (`_SharedProducer` step 3)
                self._shared.again(lambda: self._produce_request(payload, delivered, poll=True))
            elif err is not None:
                router.fail(
                    rid,
                    fut,
                    ProducerError(
                        f"request not delivered: {err}", code="delivery_failed", request_id=rid
                    ),
                )
            elif msg.offset() is None:
                # A duplicate-sequence answer does not prove the request was written (the
                # embedded broker gives it for records it lost in a restart). Send it again
                # (from the poll thread, not from this callback): the TN runs a request id
                # once and answers every copy with the same result.
                self._shared.again(lambda: self._produce_request(payload, delivered, poll=True))

        self._produce_request(payload, delivered)
        return fut

    def _produce_request(
        self, payload: bytes, on_delivery: Callable[[Any, Any], None], poll: bool = False
    ) -> None:
        """`poll`: on a full queue, serve delivery reports meanwhile (the poll thread must:
        nobody else would); else wait for the poll thread to serve them."""
        while True:
            try:
                self._shared.produce(
                    self.requests_topic,
                    value=payload,
                    key=self.client_id,
                    on_delivery=on_delivery,
                    headers=_REQUEST_HEADERS,
                )
                return
            except BufferError:
                if poll:
                    self._shared.producer.poll(0.005)
                else:
                    time.sleep(0.005)

    def _forget(self, request_id: str, fut: Future[CommitResult]) -> None:
        self._router.forget(request_id, fut)

    def flush(self, timeout: float = 10.0) -> None:
        self._shared.flush(timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._shared.flush(10)
        self._router.release()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _discard_after_answer(
    fut: Future[CommitResult], store: ObjectStore, uploads: list[str]
) -> None:
    """A large transaction's uploads, once the TN answered (producers.spill step 4): on a
    thread of its own, not the results reader's."""
    exc = fut.exception()
    if exc is not None and not isinstance(exc, (ConflictError, ValidationError, AbortedError)):
        return  # no answer (timeout, closed, not delivered): a retry may need them
    threading.Thread(
        target=discard, args=(store, uploads), name="kwal-discard-uploads", daemon=True
    ).start()


class Transaction:
    """Operations collected locally; sent as one TxnRequest by commit()."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._ops: list[TxnOp] = []
        self._sent = False
        self.request_id = new_request_id()

    def _add(self, op: TxnOp) -> Transaction:
        if self._sent:
            raise ProducerError("transaction already committed", code="already_committed")
        self._ops.append(op)
        return self

    # DDL
    def create_database(self, name: str) -> Transaction:
        return self._add(TxnOp(OpKind.CREATE_DATABASE, name))

    def drop_database(self, name: str) -> Transaction:
        return self._add(TxnOp(OpKind.DROP_DATABASE, name))

    def create_table(
        self,
        name: str,
        columns: Sequence[tuple[str, str]] | Mapping[str, str],
        primary_key: str,
    ) -> Transaction:
        db, table = split_table(name)
        items = list(columns.items()) if isinstance(columns, Mapping) else list(columns)
        cols = tuple(Column(c, t) for c, t in items)
        return self._add(TxnOp(OpKind.CREATE_TABLE, db, table, cols, primary_key))

    def drop_table(self, name: str) -> Transaction:
        db, table = split_table(name)
        return self._add(TxnOp(OpKind.DROP_TABLE, db, table))

    def add_column(self, name: str, column: str, type: str) -> Transaction:
        db, table = split_table(name)
        return self._add(TxnOp(OpKind.ADD_COLUMN, db, table, (Column(column, type),)))

    def drop_column(self, name: str, column: str) -> Transaction:
        db, table = split_table(name)
        return self._add(TxnOp(OpKind.DROP_COLUMN, db, table, (Column(column, ""),)))

    # DML
    def insert(self, table: str, rows: Rows, columns: Sequence[str] | None = None) -> Transaction:
        db, t = split_table(table)
        return self._add(TxnOp(OpKind.INSERT, db, t, rows=to_arrow(rows, columns)))

    def update(self, table: str, rows: Rows, columns: Sequence[str] | None = None) -> Transaction:
        """Replace whole rows by primary key (delete + insert on the TN)."""
        db, t = split_table(table)
        return self._add(TxnOp(OpKind.UPDATE, db, t, rows=to_arrow(rows, columns)))

    def delete(self, table: str, keys: Sequence[Any]) -> Transaction:
        db, t = split_table(table)
        return self._add(TxnOp(OpKind.DELETE, db, t, keys=tuple(keys)))

    # commit
    def commit_async(self, request_id: str | None = None) -> Future[CommitResult]:
        """Send; the future gets the result. `request_id`: the id of an earlier attempt of
        this same transaction whose outcome is unknown (a timeout, a restart of the
        caller): the TN runs an id once and answers a repeat with the first outcome, while
        that attempt is among its last `tn.dedup_window` requests (docs/retries.md).
        Default: a fresh id (`self.request_id`)."""
        if self._sent:
            raise ProducerError("transaction already committed", code="already_committed")
        if request_id is not None:
            self.request_id = check_request_id(request_id)
        if not self._ops:
            raise ValidationError("empty transaction", code="empty_transaction")
        client = self._client
        ops = list(self._ops)
        size = check_size(ops, client.cfg.client, self.request_id)
        uploads: list[str] = []
        if needs_spill(size, client.cfg.client):
            store = client.object_store()
            ops, uploads = spill(ops, store, client.cfg.client, client.client_id, self.request_id)
        self._sent = True
        req = TxnRequest(
            request_id=self.request_id,
            client_id=client.client_id,
            ops=tuple(ops),
            sent_at_ms=int(time.time() * 1000),
        )
        try:
            fut = client._send(req)
        except Exception:
            if uploads:
                discard(client.object_store(), uploads)
            raise
        if uploads:
            fut.add_done_callback(lambda f: _discard_after_answer(f, client.object_store(), uploads))
        return fut

    def commit(self, timeout: float | None = 30.0, request_id: str | None = None) -> CommitResult:
        """Send and wait. Raises ConflictError, ValidationError, TimeoutError
        (outcome unknown: retry with `request_id=err.request_id`), or another
        ProducerError. `request_id` as in `commit_async`."""
        fut = self.commit_async(request_id)
        try:
            return fut.result(timeout=timeout)
        except FutureTimeout:
            self._client._forget(self.request_id, fut)
            raise TimeoutError(
                f"no result for request {self.request_id} within {timeout}s (outcome unknown)",
                request_id=self.request_id,
            ) from None
