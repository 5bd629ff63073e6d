"""The TN service: requests topic -> engine -> results topic.

Threads
-------
- the *request loop* consumes the requests topic (``assign()``, no group),
  decodes and validates each record, applies its ops to a new engine
  transaction and calls ``commit()``, which returns at once with a future: many
  transactions are in flight, the engine's pipeline commits them in order;
- the engine's commit futures complete on the engine's threads; their
  callbacks only enqueue the result;
- the *publisher* produces results (on the WAL's transactional bus where the TN
  fences at the broker, docs/fencing.md; else one idempotent producer) and
  handles delivery reports.

Exactly-once
------------
`tn.service.system_tables` says how (two system tables written through the engine, in
the WAL with the user's writes) and what it guarantees; the service keeps them:
`_recover` reads them at start, with the results topic from R on
(`tn.service.results_scan`), and `_write_progress` moves C and R forward.

Grouping
--------
INSERT-only requests on distinct keys run as one engine transaction
(`tn.service.grouping`).

A log failure
-------------
When the engine stops after a WAL failure (a lost broker past
`wal.append_timeout_s`, a producer librdkafka declared fatal), the commits it
failed have an *unknown* outcome: an entry the log did store is replayed when
the log is reopened. So the service does not answer them: it stops consuming,
leaves them unresolved, and reports `log_failure`. Its owner (`tn.service.main`)
stops it, reopens the log, recovers a new engine and starts a new service, whose
start-up (`tn.service.system_tables`) answers each of those requests truthfully: committed if its
id was replayed into ``kwal_system.requests``, otherwise it is run.

Principals
----------
In secure mode (`[security] enabled`, docs/security.md) the requests topic is written
by the gateway only (`tn.service.gateway`, Kafka ACLs), which names each record's
sender, as the broker authenticated it, in the `kwal-principal` header. A request
whose client id is not its sender's principal is refused (`forged_client`); the others
run with their id scoped by the principal (`<principal>/<id>`, in the system tables
too), so that one principal's ids never dedup against, or replay, another's; `write_acl`
is evaluated against the principal. Every result names the principal as its client id:
the gateway sends it to that principal's results topic. A record without the header
(nobody to answer) is dropped and counted.

Undecodable requests
--------------------
If even the request id cannot be read, the result's request id is
``@<partition>:<offset>`` of the request record and its Kafka key is the
request record's key (the client id), so nobody's future waits for it; the
client that sent it times out. If the id can be read (the envelope is intact
but the body is not, or the request is oversized), the result carries it.

A stuck requests reader
-----------------------
librdkafka's consumer can stop fetching an `assign()`ed partition after a broker restart:
the TN then polls nothing while clients' requests pile up on the topic -- seen in
`tests/faults/test_broker_restart.py` (1 run in 6). The request loop runs
`infra.reader_stall`'s check (reader "requests", setting `tn.requests_stall_s`) with its
position: one past the last record it took. When the partition is stuck, the loop assigns
it again at that position (and resumes it). Nothing is skipped or read twice. A consumer
whose checks cannot reach the partition's end three times in a row (a client that lost
every broker: docs/broker-restart.md) is replaced by a new one at that position.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from infra.config import KwalConfig
from infra.kafka_io import FETCH_WAIT_MS, poll_batch
from infra.kafka_txn import TxnChannel
from infra.metrics import METRICS, observe_all
from infra.objectstore import ObjectStore
from infra.principals import PRINCIPAL_HEADER, scoped_id
from infra.queues import drain
from infra.reader_stall import StallWatch, has_records
from schemas.exceptions import CodecError, UnsupportedFormatError
from schemas.requests import (
    RESULTS_BATCH,
    RESULTS_HEADER,
    Kind,
    Reason,
    RequestFormatError,
    Status,
    TxnRequest,
    TxnResult,
    decode_request,
    peek_request_id,
)
from tn.exceptions import ConflictError, EngineClosedError, LogFailedError, TnError
from tn.exceptions import ValidationError as EngineValidationError
from tn.service.acl import WriteAcl
from tn.service.apply import RequestInvalid, apply_ops, result_for_error
from tn.service.grouping import Group, Member, member_of
from tn.service.result_batches import Item, OutRecord, pack
from tn.service.results_scan import read_results
from tn.service.system_tables import (
    commit_progress,
    committed_requests,
    create_system_tables,
    find_commit_ts,
    read_progress,
    record_requests,
)

log = logging.getLogger("kwal.tn.service")

RESULTS_SLACK = 10_000  # re-read this many extra results on restart (broker offset quirks)


class ServiceError(RuntimeError):
    pass


def tn_consumer_conf(cfg: KwalConfig, group_id: str) -> dict[str, Any]:
    """The requests reader's settings (assigned, never committed: the position is the
    TN's own, in kwal_system.progress)."""
    return cfg.kafka_client(
        **{
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            "enable.partition.eof": False,
            "auto.offset.reset": "earliest",
        }
    )


def tn_producer_conf(cfg: KwalConfig) -> dict[str, Any]:
    """The results producer's settings."""
    return cfg.kafka_client(**{"enable.idempotence": True, "acks": "all", "linger.ms": 1})




class TnService:
    def __init__(
        self,
        cfg: KwalConfig,
        engine: Any,
        *,
        exactly_once: bool = True,
        max_inflight: int = 8192,
        progress_interval_s: float = 0.5,
        recent_results: int | None = None,
        dedup_window: int | None = None,
        group_max: int = 64,
        store: ObjectStore | None = None,
        producer: TxnChannel | None = None,
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.store = store  # large transactions' objects (None: such requests abort)
        self.acl = WriteAcl(cfg.tn.write_acl)
        # secure mode: each request's principal comes from the gateway's header (see
        # "Principals"); request offset -> principal until the request is resolved
        self.secure = cfg.security.enabled
        self._principal_at: dict[int, str] = {}
        # request offsets whose client reads result batches (header kwal-results: batch),
        # until resolved
        self._batch_ok: set[int] = set()
        self.exactly_once = exactly_once
        self.max_inflight = max_inflight
        self.progress_interval_s = progress_interval_s
        self.partition = 0
        self._stall = StallWatch(
            "requests", cfg.tn.requests_stall_s, "tn.requests_stall_s", self._new_consumer
        )
        self._stop = threading.Event()
        self._halt_logged = False  # `_halted_by_log` said so once
        self._fatal_logged = False  # `_undelivered` said so once
        # results for the publisher: a commit group's results go in as ONE list, so
        # that they leave in one record per client (`tn.service.result_batches`)
        self._out: queue.SimpleQueue[list[Item] | None] = queue.SimpleQueue()
        self._lock = threading.Condition()
        self._pending: list[int] = []  # heap of request offsets not yet resolved
        self._resolved: set[int] = set()  # lazily removed from the heap
        self._next_offset = 0  # one past the last consumed request offset
        self._received: dict[int, float] = {}  # request offset -> when consumed (latency)
        self._delivered_above: dict[int, int] = {}  # req offset -> result offset
        self._last_result_offset = -1
        # (req offset, id) to prune, in commit order -- nearly offset order (a group's
        # member that runs again alone commits a little later): `_write_progress` prunes
        # from the left up to the first offset still inside the window, so a late one
        # stays a few requests longer, never less long
        self._committed_ids: deque[tuple[int, str]] = deque()
        self._inflight_ids: set[str] = set()
        self._recent: OrderedDict[str, TxnResult] = OrderedDict()
        self.dedup_window = cfg.tn.dedup_window if dedup_window is None else dedup_window
        self._recent_max = self.dedup_window if recent_results is None else recent_results
        self.group_max = group_max
        self._retries: queue.SimpleQueue[Member] = queue.SimpleQueue()
        # request offsets that already have a result on the results topic (read at start)
        self._answered_offsets: set[int] = set()
        # request id -> offsets of later copies waiting for the first copy's answer
        self._waiters: dict[str, list[int]] = {}
        self._committed_before: dict[str, int] = {}  # id -> req offset, from the table
        self._progress_written = (-1, -1)
        self._progress_inflight: Future[int] | None = None
        self._last_progress = 0.0
        self._threads: list[threading.Thread] = []
        self.processed = 0
        # A channel of the WAL's transactional bus where the TN fences at the broker
        # (docs/fencing.md): a result is visible (read_committed) only once committed in a
        # transaction of this TN's epoch; a replaced TN's results are aborted.
        self._producer: Producer | TxnChannel = producer if producer is not None else Producer(tn_producer_conf(cfg))
        self._consumer: Consumer | None = None

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Bootstrap system tables, recover the position, start the threads."""
        start_offset = self._recover()
        self._consumer = self._new_consumer()
        self._consumer.assign(
            [TopicPartition(self.cfg.topics.requests, self.partition, start_offset)]
        )
        self._next_offset = max(start_offset, 0)
        for target, name in (
            (self._request_loop, "kwal-tn-requests"),
            (self._publisher, "kwal-tn-results"),
        ):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        log.info("TN service consuming %s from offset %s", self.cfg.topics.requests, start_offset)

    def _new_consumer(self) -> Consumer:
        """The requests reader's client (at start, and in place of a lost one)."""
        return Consumer(tn_consumer_conf(self.cfg, f"{self.cfg.topics.prefix}.tn"))

    def stop(self, drain_timeout_s: float = 10.0) -> None:
        """Stop consuming, let in-flight commits finish and their results go out."""
        self._stop.set()
        if self._threads:
            self._threads[0].join(timeout=drain_timeout_s)
        deadline = time.monotonic() + drain_timeout_s
        with self._lock:
            # after a log failure some requests stay unresolved on purpose (see "A log failure")
            while self._unresolved() and self.log_failure is None and time.monotonic() < deadline:
                self._lock.wait(0.05)
        self._out.put(None)
        for t in self._threads[1:]:
            t.join(timeout=drain_timeout_s)
        self._producer.flush(drain_timeout_s)
        if self.log_failure is None:
            self._write_progress(force=True, wait=True)
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def healthy(self) -> bool:
        return all(t.is_alive() for t in self._threads) and not self._stop.is_set()

    @property
    def log_failure(self) -> BaseException | None:
        """The engine's log failure, which halts the service (see "A log failure"), or None.
        The engine's, not only what the service's own commits met: a checkpoint's commit
        can be the one that met it."""
        return self.engine.log_failure

    def _halted_by_log(self, e: BaseException) -> bool:
        """Is `e` the engine's log failure (outcome unknown), not a verdict on the request?
        If so the service halts: the request stays unanswered until the log is reopened.
        (The engine records its failure before it fails any commit with it.)"""
        failure = self.engine.log_failure
        if failure is None or not isinstance(e, LogFailedError | EngineClosedError):
            return False
        if not self._halt_logged:
            self._halt_logged = True
            log.error(
                "the engine stopped after a log failure; the service stops consuming and "
                "leaves the requests it could not commit unanswered: %s",
                failure,
            )
        with self._lock:
            self._lock.notify_all()
        return True

    # ---- recovery -------------------------------------------------------------------------

    def _recover(self) -> int:
        if not self.exactly_once:
            return OFFSET_BEGINNING
        if create_system_tables(self.engine):
            return OFFSET_BEGINNING
        c, r = read_progress(self.engine)
        self._progress_written = (c, r)
        for req_offset, request_id in sorted(committed_requests(self.engine)):
            self._committed_before[request_id] = req_offset
            self._committed_ids.append((req_offset, request_id))
        self._scan_results(
            max(0, r - RESULTS_SLACK - self.dedup_window) if r >= 0 else 0,
            max(c, 0),
            max(c, 0) - self.dedup_window,
        )
        log.info(
            "TN recovered: resume requests at %s; %d committed ids in window; %d answered",
            c,
            len(self._committed_before),
            len(self._answered_offsets),
        )
        return c if c >= 0 else OFFSET_BEGINNING

    def _scan_results(self, from_offset: int, min_request_offset: int, window_start: int) -> None:
        """Collect the request offsets answered at or above `min_request_offset` (C), and
        remember the results of requests at or above `window_start` (C - dedup_window), so
        that a repeated id gets its first outcome, aborted ones included (they are in no
        table)."""
        recent = []
        for res in read_results(self.cfg, from_offset):
            if res.request_offset >= min_request_offset:
                self._answered_offsets.add(res.request_offset)
            if res.request_offset >= window_start:
                recent.append(res)
        self._remember_all(recent)

    # ---- the request loop -----------------------------------------------------------------

    def _request_loop(self) -> None:
        assert self._consumer is not None
        consumer = self._consumer
        while not self._stop.is_set() and self.log_failure is None:
            self._drain_retries()
            with self._lock:
                while (
                    self._unresolved() >= self.max_inflight
                    and not self._stop.is_set()
                    and self.log_failure is None
                ):
                    self._lock.wait(0.05)
            try:
                msgs = poll_batch(consumer, 256, 0.05)
            except Exception:  # noqa: BLE001 - keep the TN up through broker hiccups
                log.exception("consume failed")
                time.sleep(0.2)
                continue
            if self._stall.polled(has_records(msgs)):  # see "A stuck requests reader"
                consumer = self._consumer = self._stall.unstick(
                    consumer, {(self.cfg.topics.requests, self.partition): self._next_offset}
                )
            group = Group()
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        log.warning("requests consumer: %s", err)
                    continue
                offset = msg.offset()
                assert offset is not None
                req: TxnRequest | None = None
                try:
                    principal, batch = _headers(msg)
                    req = self._accept(offset, msg.key(), msg.value() or b"", principal, batch)
                    if req is None:
                        continue
                    member = member_of(self.engine, req, offset) if self.group_max > 1 else None
                    if member is None:
                        self._flush(group)
                        self._execute(req, offset)
                    else:
                        if not group.fits(member, self.group_max):
                            self._flush(group)
                        group.add(member)
                except RequestInvalid as e:
                    self._fail(req, offset, msg.key(), e)
                except Exception as e:  # noqa: BLE001 - a bug in one request must not kill the TN
                    log.exception("request at offset %s", offset)
                    self._fail(req, offset, msg.key(), e)
            self._flush(group)
            self._maybe_write_progress()
        # stopping: requests of aborted groups still get their individual run
        deadline = time.monotonic() + 5
        while self._unresolved() and self.log_failure is None and time.monotonic() < deadline:
            self._drain_retries()
            time.sleep(0.01)

    def _fail(
        self, req: TxnRequest | None, offset: int, key: bytes | None, e: BaseException
    ) -> None:
        """Answer the request with the verdict `e` maps to; a log failure is no verdict."""
        if self._halted_by_log(e):
            return
        if req is None:
            res = TxnResult.aborted(
                f"@{self.partition}:{offset}",
                Kind.INTERNAL,
                Reason.INTERNAL,
                "internal error handling the request",
                request_offset=offset,
            )
        else:
            res = result_for_error(
                req.request_id, e, client_id=req.client_id, request_offset=offset
            )
            key = req.request_id.encode()
        self._publish(res, key, offset)

    def _accept(
        self,
        offset: int,
        key: bytes | None,
        value: bytes,
        principal: str | None = None,
        batch: bool = False,
    ) -> TxnRequest | None:
        """Decode and deduplicate one request record. Returns the request to run
        (now marked in flight), or None when it has been answered here. `principal`: the
        sender the gateway named (secure mode, see "Principals"); `batch`: its client
        reads result batches (`tn.service.result_batches`)."""
        with self._lock:
            heapq.heappush(self._pending, offset)
            if batch:
                self._batch_ok.add(offset)
            self._next_offset = offset + 1
            self._received[offset] = time.monotonic()
            if self.secure and principal:
                self._principal_at[offset] = principal
        self.processed += 1
        if self.secure and not principal:
            # nobody to answer: only the gateway writes this topic, and it always names one
            METRICS.security_dropped.labels("request_without_principal").inc()
            log.warning("request at offset %s has no principal header: dropped", offset)
            self._resolve(offset)
            return None

        def peeked() -> str:
            rid = peek_request_id(value)
            if rid is None:
                return f"@{self.partition}:{offset}"
            return scoped_id(principal, rid) if self.secure and principal else rid

        req: TxnRequest | None = None
        error: TxnResult | None = None
        if len(value) > self.cfg.tn.max_request_bytes:
            rid = peeked()
            error = TxnResult.aborted(
                rid,
                Kind.VALIDATION,
                Reason.TOO_LARGE,
                f"request of {len(value)} bytes exceeds tn.max_request_bytes={self.cfg.tn.max_request_bytes}",
            )
        else:
            try:
                req = decode_request(value)
            except UnsupportedFormatError as e:
                # a kwal envelope of a version (or schema) this TN does not know,
                # or not a kwal record at all
                rid = peeked()
                reason = Reason.UNSUPPORTED_VERSION if value[:2] == b"KW" else Reason.UNDECODABLE
                error = TxnResult.aborted(rid, Kind.VALIDATION, reason, str(e))
            except (CodecError, RequestFormatError, ValueError, KeyError, TypeError) as e:
                rid = peeked()
                error = TxnResult.aborted(
                    rid, Kind.VALIDATION, Reason.UNDECODABLE, f"{type(e).__name__}: {e}"
                )
        if req is not None and self.secure and principal:
            scoped = scoped_id(principal, req.request_id)
            if req.client_id != principal:
                error = TxnResult.aborted(
                    scoped,
                    Kind.PERMISSION,
                    Reason.FORGED_CLIENT,
                    f"the request names client {req.client_id!r} but its sender authenticated "
                    f"as {principal!r}",
                    client_id=principal,
                )
                key, req = scoped.encode(), None
            else:
                req = dataclasses.replace(req, request_id=scoped)
        if req is not None:
            why = self.acl.denied(req)
            if why is not None:
                error = TxnResult.aborted(
                    req.request_id, Kind.PERMISSION, "permission_denied", why, client_id=req.client_id
                )
                key, req = req.request_id.encode(), None
        if req is None:
            assert error is not None
            self._publish(_with(error, request_offset=offset), key, offset)
            return None
        rid = req.request_id
        with self._lock:
            answered = offset in self._answered_offsets
            known = self._recent.get(rid)
            inflight = rid in self._inflight_ids
            if not answered and known is None:
                if inflight:
                    # another copy of this id is running: this copy is answered with
                    # its result when that one is delivered (`_delivered`)
                    self._waiters.setdefault(rid, []).append(offset)
                else:
                    self._inflight_ids.add(rid)
        if answered:
            self._resolve(offset)  # this very record was answered before the restart
            return None
        if known is not None:  # an earlier copy was answered: the same answer again
            self._republish(known, offset)
            return None
        if inflight:
            return None
        if rid in self._committed_before:
            ts = find_commit_ts(self.engine, rid)
            kw = {"client_id": req.client_id, "request_offset": offset}
            self._publish(TxnResult.ok(rid, ts, **kw), rid.encode(), offset)
            return None
        return req

    def _execute(self, req: TxnRequest, offset: int) -> None:
        """Run one request as its own engine transaction."""
        rid = req.request_id
        try:
            txn = self.engine.begin()
        except TnError as e:
            self._fail(req, offset, None, e)
            return
        try:
            apply_ops(self.engine, txn, req, self.store)
            if self.exactly_once:
                record_requests(txn, [(rid, offset)])
            fut = txn.commit()
        except Exception as e:  # noqa: BLE001 - validation, engine or unexpected: abort it
            _rollback(txn)
            self._fail(req, offset, None, e)
            return
        fut.add_done_callback(lambda f: self._committed(f, req, offset))

    def _committed(self, fut: Future[int], req: TxnRequest, offset: int) -> None:
        exc = fut.exception()
        if exc is not None:
            self._fail(req, offset, None, exc)
            return
        rid = req.request_id
        with self._lock:
            self._committed_ids.append((offset, rid))
        res = TxnResult.ok(rid, int(fut.result()), client_id=req.client_id, request_offset=offset)
        self._publish(res, rid.encode(), offset)

    # ---- grouping -------------------------------------------------------------------------

    def _flush(self, group: Group) -> None:
        members = group.take()
        if not members:
            return
        if len(members) == 1:
            self._execute(members[0].req, members[0].offset)
            return
        try:
            txn = self.engine.begin()
        except TnError as e:
            for m in members:
                self._fail(m.req, m.offset, None, e)
            return
        try:
            by_table: dict[tuple[str, str], list[pa.Table]] = {}
            for m in members:
                for db, table, rows in m.inserts:
                    by_table.setdefault((db, table), []).append(rows)
            for (db, table), tables in by_table.items():
                for same in _by_schema(tables):
                    txn.insert(db, table, pa.concat_tables(same))
            if self.exactly_once:
                record_requests(txn, [(m.req.request_id, m.offset) for m in members])
            fut = txn.commit()
        except Exception as e:  # noqa: BLE001 - one member's problem: run each alone
            _rollback(txn)
            if isinstance(e, EngineClosedError | LogFailedError):
                for m in members:
                    self._fail(m.req, m.offset, None, e)
                return
            for m in members:
                self._execute(m.req, m.offset)
            return
        fut.add_done_callback(lambda f: self._group_committed(f, members))

    def _group_committed(self, fut: Future[int], members: list[Member]) -> None:
        exc = fut.exception()
        if exc is None:
            ts = int(fut.result())
            with self._lock:
                self._committed_ids.extend((m.offset, m.req.request_id) for m in members)
            # positional: `TxnResult.ok(**kw)` costs a keyword dict and a second call per
            # member, and a group's results are made on the engine's completion thread
            committed, none = Status.COMMITTED, Kind.NONE
            self._publish_all(
                [
                    (
                        TxnResult(
                            m.req.request_id,
                            committed,
                            ts,
                            none,
                            "",
                            "",
                            m.req.client_id,
                            m.offset,
                        ),
                        m.req.request_id.encode(),
                        m.offset,
                    )
                    for m in members
                ]
            )
        elif isinstance(exc, ConflictError | EngineValidationError):
            # the group lost a conflict (or one member broke it): nothing of it is
            # visible; each member runs again alone, in the request loop
            for m in members:
                self._retries.put(m)
        else:
            for m in members:
                self._fail(m.req, m.offset, None, exc)

    def _drain_retries(self) -> None:
        for m in drain(self._retries):
            try:
                self._execute(m.req, m.offset)
            except Exception as e:  # noqa: BLE001
                self._fail(m.req, m.offset, None, e)

    def _publish(self, res: TxnResult, key: bytes | None, offset: int) -> None:
        self._publish_all([(res, key, offset)])

    def _publish_all(self, items: list[Item]) -> None:
        """Queue results for the publisher as one unit (a commit group's: they leave
        together, one record per client that reads batches)."""
        if self.secure:
            # the gateway sends a result to its principal's topic (an undecodable request's too)
            with self._lock:
                items = [
                    (_with(r, client_id=self._principal_at.get(o, "")), k, o)
                    if not r.client_id
                    else (r, k, o)
                    for r, k, o in items
                ]
        # metrics once per unit, not per result: one histogram update for the group's
        # latencies, one counter increment for its commits
        now = time.monotonic()
        received, ok = self._received, Status.COMMITTED
        latencies = []
        committed = 0
        for res, _, offset in items:
            if res.status is ok:
                committed += 1
            else:
                METRICS.aborts.labels(res.reason or "unknown").inc()
            at = received.get(offset)
            if at is not None:
                latencies.append(now - at)
        if latencies:
            observe_all(METRICS.commit_latency, latencies)
        if committed:
            METRICS.commits.inc(committed)
        self._out.put(items)

    # ---- the publisher --------------------------------------------------------------------

    def _publisher(self) -> None:
        """Drain the queue, pack it (`tn.service.result_batches`: one record per client
        per drain for clients that read batches), produce; a record's delivery report
        answers every result in it."""
        topic = self.cfg.topics.results
        while True:
            try:
                first = self._out.get(timeout=0.02)
            except queue.Empty:
                self._producer.poll(0)
                continue
            items: list[Item] = []
            stop = False
            for unit in itertools.chain((first,), drain(self._out)):
                if unit is None:
                    stop = True
                    break
                items.extend(unit)
            records = pack(items, self._batch_ok.__contains__)
            self._remember_all([res for rec in records for res, _, _ in rec.items])
            for rec in records:

                def delivered(err: Any, msg: Any, rec: OutRecord = rec) -> None:
                    result_offset = None if err is not None else msg.offset()
                    if err is not None and err.fatal():
                        # the producer can send nothing more (fenced by a newer TN, say):
                        # the requests stay unanswered here; the TN that took over answers
                        self._undelivered(rec.items[0][0], err)
                        return
                    if result_offset is None:
                        # a failure, or a duplicate-sequence answer, which does not prove
                        # the record was written (the embedded broker loses such records
                        # in a restart)
                        why = err or "acknowledged without an offset"
                        log.warning(
                            "result %s (%d in its record) not delivered (%s); retrying",
                            rec.items[0][0].request_id,
                            len(rec.items),
                            why,
                        )
                        self._out.put(rec.items)
                        return
                    self._delivered(rec.items, result_offset)

                while True:
                    try:
                        self._producer.produce(
                            topic, value=rec.value, key=rec.key, on_delivery=delivered
                        )
                        break
                    except BufferError:
                        self._producer.poll(0.01)
            self._producer.poll(0)
            if stop:
                self._producer.flush(10)
                return

    def _undelivered(self, res: TxnResult, err: Any) -> None:
        if not self._fatal_logged:
            self._fatal_logged = True
            log.error(
                "results cannot be published any more (%s); %s and later results stay "
                "unanswered here: the TN that takes over answers them",
                err,
                res.request_id,
            )

    def _delivered(self, items: list[Item], result_offset: int) -> None:
        """The results of one record (`items`) are on the results topic at `result_offset`:
        their requests are resolved, under one hold of the lock and with one wake-up of
        the threads that wait for room, and later copies of their ids are answered."""
        republish: list[tuple[TxnResult, int]] = []
        with self._lock:
            inflight, waiters, above = self._inflight_ids, self._waiters, self._delivered_above
            for res, _, req_offset in items:
                inflight.discard(res.request_id)
                if waiters:
                    republish.extend((res, o) for o in waiters.pop(res.request_id, ()))
                had = above.get(req_offset)
                if had is None or had > result_offset:
                    above[req_offset] = result_offset
            if result_offset > self._last_result_offset:
                self._last_result_offset = result_offset
            self._resolve_all_locked([offset for _, _, offset in items])
        for res, offset in republish:
            self._republish(res, offset)

    def _republish(self, res: TxnResult, offset: int) -> None:
        """Answer another copy of an already answered request id (not counted in metrics:
        it is the same transaction). The result names the copy's own request offset, so a
        restart's results scan knows exactly which records were answered."""
        self._out.put([(_with(res, request_offset=offset), res.request_id.encode(), offset)])

    def _remember_all(self, results: list[TxnResult]) -> None:
        """Keep results for repeated ids (the dedup window), newest last: one hold of the
        lock for a whole drain of the publisher's queue."""
        recent = self._recent
        with self._lock:
            for res in results:
                rid = res.request_id
                if rid in recent:
                    recent.move_to_end(rid)
                recent[rid] = res
            excess = len(recent) - self._recent_max
            for _ in range(excess):
                recent.popitem(last=False)

    # ---- resolution bookkeeping -----------------------------------------------------------

    def _resolve(self, offset: int) -> None:
        with self._lock:
            self._resolve_all_locked((offset,))

    def _resolve_all_locked(self, offsets: Iterable[int]) -> None:
        received, principal_at, batch_ok = self._received, self._principal_at, self._batch_ok
        resolved, pending = self._resolved, self._pending
        for offset in offsets:
            received.pop(offset, None)
            if principal_at:
                principal_at.pop(offset, None)
            batch_ok.discard(offset)
            resolved.add(offset)
        while pending and pending[0] in resolved:
            resolved.discard(heapq.heappop(pending))
        self._lock.notify_all()

    def _unresolved(self) -> int:
        return len(self._pending) - len(self._resolved)

    def resolved_offset(self) -> int:
        """C: every request below this offset has a delivered result."""
        with self._lock:
            return self._pending[0] if self._pending else self._next_offset

    def _maybe_write_progress(self) -> None:
        now = time.monotonic()
        if now - self._last_progress >= self.progress_interval_s:
            self._last_progress = now
            self._write_progress()

    def _write_progress(self, force: bool = False, wait: bool = False) -> None:
        if not self.exactly_once:
            return
        inflight = self._progress_inflight
        if inflight is not None and not inflight.done():
            if not wait:
                return
            try:
                inflight.result(timeout=10)
            except Exception:  # noqa: BLE001
                pass
        with self._lock:
            c = self._pending[0] if self._pending else self._next_offset
            above = [r for q, r in self._delivered_above.items() if q >= c]
            for q in [q for q in self._delivered_above if q < c]:
                del self._delivered_above[q]
            r = min(above) if above else self._last_result_offset + 1
            horizon = c - self.dedup_window
            # from the left only: a scan of the whole window (100k ids) every progress
            # interval was 7.5% of the TN's busy time at saturation (docs/perf-commit.md)
            ids = self._committed_ids
            prune = []
            while ids and ids[0][0] < horizon:
                prune.append(ids.popleft()[1])
        if (c, r) == self._progress_written and not prune:
            return
        try:
            fut = commit_progress(self.engine, c, r, prune)
        except TnError as e:
            log.warning("progress not recorded: %s", e)
            return
        self._progress_written = (c, r)
        for rid in prune:
            self._committed_before.pop(rid, None)
        self._progress_inflight = fut
        if wait:
            try:
                fut.result(timeout=10)
            except Exception as e:  # noqa: BLE001
                log.warning("progress not recorded: %s", e)


def _headers(msg: Any) -> tuple[str | None, bool]:
    """A request record's headers: its `kwal-principal` (secure mode) or None, and
    whether its client reads result batches (`kwal-results: batch`)."""
    principal: str | None = None
    batch = False
    for name, value in msg.headers() or ():
        if name == PRINCIPAL_HEADER and value:
            principal = bytes(value).decode("utf-8", "replace")
        elif name == RESULTS_HEADER and value == RESULTS_BATCH:
            batch = True
    return principal, batch


def _by_schema(tables: list[pa.Table]) -> list[list[pa.Table]]:
    """`tables` in runs of one schema each (`concat_tables` takes one), in order of each
    schema's first table. Why not a dict keyed by schema: hashing a `pa.Schema` was ~3% of
    the request loop at saturation (a fresh wrapper per table, hashed field by field);
    comparing with `equals` is cheap, and a group's tables nearly always share one."""
    first = tables[0].schema
    if all(t.schema.equals(first) for t in tables):
        return [tables]
    runs: list[tuple[pa.Schema, list[pa.Table]]] = []
    for t in tables:
        schema = t.schema
        for have, run in runs:
            if have.equals(schema):
                run.append(t)
                break
        else:
            runs.append((schema, [t]))
    return [run for _, run in runs]


def _rollback(txn: Any) -> None:
    try:
        txn.rollback()
    except Exception:  # noqa: BLE001 - already aborted is fine
        pass


def _with(res: TxnResult, **kw: Any) -> TxnResult:
    import dataclasses

    return dataclasses.replace(res, **kw)
