"""The commit pipeline (seed 003): queue -> conflict check -> CommitTS + WAL entry handed to
the log store without waiting -> visibility in queue order once durable.

1. `submit` enters the queue: a bounded number of transactions may be between
   entering and becoming visible (`queue_size`); more block the caller
   (back-pressure).
2. Under the pipeline lock, one transaction at a time: the conflict check
   (snapshot isolation: abort if a write to one of its primary keys, or a DDL on
   an object it depends on, was committed -- or queued to commit -- after its
   StartTS).
3. Still under the lock: CommitTS from the hybrid clock; the catalog changes,
   the new segments/blocks and the primary-key index are stamped with it (so
   later transactions conflict-check against it); the WAL entry is built and
   handed to the log store, which assigns the LSN. Queue order == CommitTS order
   == LSN order.
4. When the log store reports an entry durable (its future completes, in LSN
   order), the transactions at the head of the queue that are durable are made
   visible, strictly in queue order: their rows get the CommitTS, their deletes
   the delete ts, and the visible timestamp advances. Then the commit listeners
   run and the caller's future completes, by one drainer thread at a time, in
   LSN order.

A failed append fails that transaction and every one queued after it (never
made visible here: rows masked, catalog changes undone) with LogFailedError, and the
pipeline refuses further commits. Their outcome is unknown until the log is reopened:
an entry the log did store is replayed by recovery (`LogFailedError`).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from schemas.arrow_ipc import table_to_ipc
from schemas.codec import encode_entry
from schemas.wal import (
    Append,
    AppendInfo,
    CatalogKind,
    CatalogReason,
    Command,
    Delete,
    Dest,
    EntryNode,
    TxnContext,
    UpdateCatalog,
    WalEntry,
)
from tn.catalog.catalog import Catalog
from tn.catalog.nodes import ABORTED_TS, MAX_TS, BlockNode, DatabaseNode, Node, TableNode
from tn.commit.batches import serialize
from tn.exceptions import ConflictError, EngineClosedError, LogFailedError, TnError
from tn.logstore.driver import LogStore
from tn.txn.clock import HybridClock
from tn.txn.transaction import Transaction

log = logging.getLogger(__name__)

CommitListener = Callable[[WalEntry], None]

_PENDING, _DURABLE, _FAILED = 0, 1, 2

# How many groups a committing client thread processes as leader before it hands the
# rest of the queue to the committer thread (bounds the time its commit() call takes).
LEADER_GROUPS = 8


class _InFlight:
    __slots__ = ("txn", "cts", "commands", "memo", "future", "entry", "state", "undo", "error")

    def __init__(self, txn: Transaction | None, cts: int, future: Future[int]) -> None:
        self.txn = txn
        self.cts = cts
        self.commands: list[Command] = []
        self.memo: dict[int, Dest] = {}
        self.future = future
        self.entry: WalEntry | None = None
        self.state = _PENDING
        self.undo: list[tuple[str, Any]] = []
        self.error: BaseException | None = None

    def encode(self, lsn: int) -> bytes:
        assert self.txn is not None
        entry = WalEntry(
            lsn,
            TxnContext(self.txn.start_ts, self.cts, tuple(self.memo.values())),
            tuple(self.commands),
        )
        data = encode_entry(entry)
        self.entry = entry
        return data


def _write_conflict(t: TableNode, k: Any) -> ConflictError:
    return ConflictError(
        "write_conflict", f"key {k!r} of {t.db.name}.{t.name} was written concurrently"
    )


def _set_attr(undo: list[tuple[str, Any]], obj: Any, name: str, value: int) -> None:
    undo.append(("attr", (obj, name, getattr(obj, name))))
    setattr(obj, name, value)


def _set_key(undo: list[tuple[str, Any]], d: dict[str, int], key: str, value: int) -> None:
    undo.append(("key", (d, key, d.get(key))))
    d[key] = value


class CommitPipeline:
    def __init__(
        self, catalog: Catalog, log_store: LogStore, clock: HybridClock, queue_size: int = 4096
    ) -> None:
        self._catalog = catalog
        self._log = log_store
        self._clock = clock
        self._lock = threading.Lock()
        # _vis guards the in-flight queue and visibility; a plain lock on the hot path, and
        # a condition on the same lock for the (rare) readers waiting for visibility.
        self._vis = threading.Lock()
        self._vis_cond = threading.Condition(self._vis)
        self._waiters = 0
        self._inflight: deque[_InFlight] = deque()
        self._draining = False
        self._slots = threading.BoundedSemaphore(queue_size)
        self.visible_ts = 0
        self.failed: LogFailedError | None = None
        self.closed = False
        self.listeners: list[CommitListener] = []
        self.heartbeat_listeners: list[Callable[[int], None]] = []
        # steps 2-3 run on whichever committing thread finds the pipeline free (the
        # leader); it takes every queued transaction as one group, the others just wait
        # for their futures.
        self._queue: deque[tuple[Transaction | None, Future[int]]] = deque()
        self._leader = threading.Lock()
        self._committer: threading.Thread | None = None  # started when first needed
        self._work = threading.Event()
        self._stop = False

    # -- steps 1-3 -----------------------------------------------------------------------
    def submit(self, txn: Transaction) -> Future[int]:
        """Step 1: enter the queue (blocks while `queue_size` commits are in flight)."""
        fut: Future[int] = Future()
        if not txn.has_writes:
            txn.mark("committed")
            fut.set_result(txn.start_ts)
            return fut
        self._slots.acquire()
        if self.closed:
            self._slots.release()
            self._abort(txn, fut, EngineClosedError("engine_closed", "engine is closed"))
            return fut
        self._queue.append((txn, fut))
        self._lead()
        return fut

    def heartbeat(self) -> Future[int]:
        """An empty transaction: a timestamp drawn in queue order, nothing logged. Its
        future completes (after the heartbeat listeners ran) once every transaction queued
        before it is visible or failed."""
        fut: Future[int] = Future()
        if self.closed or self.failed is not None:
            fut.set_exception(EngineClosedError("engine_closed", "engine is closed or failed"))
            return fut
        self._slots.acquire()
        self._queue.append((None, fut))
        self._lead()
        return fut

    def _abort(self, txn: Transaction, fut: Future[int], err: TnError) -> None:
        txn.mark("aborted")
        txn.discard()
        fut.set_exception(err)

    def _lead(self) -> None:
        """Become the leader if nobody is, and run steps 2-3 for one group of queued
        transactions. Whatever is still queued afterwards goes to the committer thread, so
        a client thread never stays leader for long (it would never return under steady
        load). A transaction queued while a leader finishes is picked up by that leader's
        re-check, so nothing is stranded."""
        q = self._queue
        if q and self._leader.acquire(blocking=False):
            try:
                for _ in range(LEADER_GROUPS):
                    if not q:
                        break
                    self._group(q)
            finally:
                self._leader.release()
        if q:
            self._kick()

    def _kick(self) -> None:
        if self._committer is None:
            with self._lock:
                if self._committer is None:
                    self._committer = threading.Thread(
                        target=self._commit_loop, name="kwal-commit", daemon=True
                    )
                    self._committer.start()
        self._work.set()

    def _commit_loop(self) -> None:
        q = self._queue
        while True:
            self._work.wait()
            self._work.clear()
            if self._stop:
                return
            while q and self._leader.acquire(blocking=False):
                try:
                    while q:
                        self._group(q)
                finally:
                    self._leader.release()

    def _group(self, q: deque[tuple[Transaction | None, Future[int]]]) -> None:
        items: list[tuple[Transaction | None, Future[int]]] = []
        while q and len(items) < 1024:
            items.append(q.popleft())
        aborted: list[tuple[Transaction | None, Future[int], TnError]] = []
        logged: list[tuple[_InFlight, Future[int]]] = []
        # The Arrow IPC batches of the whole group are built here, by the leader, in one
        # go: per-transaction pyarrow calls from many threads cost more CPU in GIL
        # hand-offs than the serialization itself.
        try:
            serialize(
                [
                    op[2]
                    for txn, _ in items
                    if txn is not None
                    for op in txn.ops
                    if op[0] == "append"
                ]
            )
        except Exception:
            log.exception("serializing the group's batches failed")
        with self._lock:
            for txn, fut in items:
                try:
                    err = self._step(txn, fut, logged)
                except Exception as e:  # a bug must not wedge the pipeline
                    log.exception("commit of a transaction failed")
                    err = TnError("internal", f"internal error in the commit pipeline: {e!r}")
                if err is not None:
                    aborted.append((txn, fut, err))
        for txn, fut, err in aborted:
            self._slots.release()
            if txn is None:
                fut.set_exception(err)
            else:
                self._abort(txn, fut, err)
        for rec, lf in logged:
            lf.add_done_callback(functools.partial(self._on_log, rec))

    def _step(
        self,
        txn: Transaction | None,
        fut: Future[int],
        logged: list[tuple[_InFlight, Future[int]]],
    ) -> TnError | None:
        """Steps 2-3 for one transaction (under the pipeline lock); txn None: a heartbeat."""
        if self.failed is not None:
            return LogFailedError(
                "log_failed", f"engine stopped after a log failure: {self.failed.message}"
            )
        if txn is None:  # a heartbeat: a timestamp in queue order, nothing to log
            rec = _InFlight(None, self._clock.now(), fut)
            done: Future[int] = Future()
            done.set_result(0)
            with self._vis:
                self._inflight.append(rec)
            logged.append((rec, done))
            return None
        err = self._check(txn)
        if err is not None:
            return err
        batches = []
        for op in txn.ops:
            if op[0] == "append":
                ipc = op[2].ipc
                if ipc is None:
                    ipc = op[2].ipc = table_to_ipc(op[2].arrow())
                batches.append(ipc)
        rec = _InFlight(txn, self._clock.now(), fut)
        self._stamp(rec, batches)
        try:
            lf = self._log.append(rec.encode)
        except Exception as e:
            if rec.entry is None:  # the entry could not be encoded: no LSN was used
                log.exception("cannot encode the WAL entry of a transaction")
                self._undo_catalog(rec)
                return TnError("internal", f"cannot encode the WAL entry: {e!r}")
            lf = Future()  # a synchronous append failure is a failed append
            lf.set_exception(e)
        # Only now, with the entry handed to the log: later transactions conflict-check
        # against this one's writes.
        for t in txn.dml_tables:
            ins = txn.inserts.get(t, [])
            dl = txn.deletes.get(t, [])
            if ins or dl:
                t.mem.index_commit(ins, dl, rec.cts)
        with self._vis:
            self._inflight.append(rec)
        logged.append((rec, lf))
        return None

    def _check(self, txn: Transaction) -> TnError | None:
        start = txn.start_ts
        cat = self._catalog
        for op in txn.ops:
            kind = op[0]
            if kind == "append":
                continue
            if kind == "sys":  # a system transaction's own conflict check (tn.checkpoint)
                check = op[2]
                err = check() if check is not None else None
                if err is not None:
                    return err
                continue
            node: Node = op[1]
            if kind == "db_create":
                if cat.db_name_ts.get(node.name, 0) > start:
                    return ConflictError(
                        "ddl_conflict", f"database {node.name!r} was changed concurrently"
                    )
            elif kind == "db_drop":
                assert isinstance(node, DatabaseNode)
                if not txn.is_new(node) and (node.delete_ts != MAX_TS or node.child_ts > start):
                    return ConflictError(
                        "ddl_conflict", f"database {node.name!r} was changed concurrently"
                    )
            elif kind == "tbl_create":
                assert isinstance(node, TableNode)
                db = node.db
                if not txn.is_new(db) and (
                    db.delete_ts != MAX_TS or db.name_ts.get(node.name, 0) > start
                ):
                    return ConflictError(
                        "ddl_conflict", f"table {db.name}.{node.name} was changed concurrently"
                    )
            else:  # tbl_alter, tbl_drop
                assert isinstance(node, TableNode)
                if not txn.is_new(node) and (node.delete_ts != MAX_TS or node.ddl_ts > start):
                    return ConflictError(
                        "ddl_conflict", f"table {node.db.name}.{node.name} was changed concurrently"
                    )
        for t in txn.dml_tables:
            if not txn.is_new(t) and (t.delete_ts != MAX_TS or t.ddl_ts > start):
                return ConflictError(
                    "ddl_conflict",
                    f"table {t.db.name}.{t.name} was dropped or altered concurrently",
                )
        for t, keys in txn.wkeys.items():
            k = t.mem.index.newer_than(keys, start)
            if k is not None:
                return _write_conflict(t, k)
        for t, arrays in txn.wkey_arrays.items():  # columnar inserts' int64 keys
            k = t.mem.index.newer_than(
                arrays[0] if len(arrays) == 1 else np.concatenate(arrays), start
            )
            if k is not None:
                return _write_conflict(t, k)
        return None

    def _stamp(self, rec: _InFlight, batches: list[bytes]) -> None:
        """Step 3 (under the lock): stamp catalog changes and the index with the CommitTS and
        build the WAL commands, in the transaction's call order."""
        txn, cts, cmds, undo, memo = rec.txn, rec.cts, rec.commands, rec.undo, rec.memo
        assert txn is not None
        cat = self._catalog
        bi = iter(batches)
        for op in txn.ops:
            kind = op[0]
            if kind == "append":
                t: TableNode = op[1]
                db_id, t_id = t.db.id, t.id
                infos = []
                for blk, row0, src, n in op[3]:
                    seg = blk.segment
                    if seg.create_ts == MAX_TS:
                        seg.create_ts = cts
                        cat.register(seg)
                        undo.append(("create", seg))
                        cmds.append(
                            UpdateCatalog(
                                CatalogKind.SEGMENT,
                                Dest(db_id, t_id, seg.id),
                                EntryNode(cts),
                                CatalogReason.ALLOCATE,
                            )
                        )
                    if blk.create_ts == MAX_TS:
                        blk.create_ts = cts
                        cat.register(blk)
                        undo.append(("create", blk))
                        cmds.append(
                            UpdateCatalog(
                                CatalogKind.BLOCK,
                                Dest(db_id, t_id, seg.id, blk.id),
                                EntryNode(cts),
                                CatalogReason.ALLOCATE,
                            )
                        )
                    dest = memo.get(blk.id)
                    if dest is None:
                        dest = memo[blk.id] = Dest(db_id, t_id, seg.id, blk.id)
                    infos.append(AppendInfo(src, n, dest, row0, n))
                cmds.append(Append(tuple(infos), next(bi)))
            elif kind == "sys":
                # a system transaction (checkpoint flush, compaction, large transaction):
                # op[1](cts) applies its catalog changes and returns their WAL commands
                cmds.extend(op[1](cts))
            elif kind == "db_create":
                db: DatabaseNode = op[1]
                db.create_ts = cts
                _set_key(undo, cat.db_name_ts, db.name, cts)
                undo.append(("create", db))
                cmds.append(
                    UpdateCatalog(CatalogKind.DATABASE, Dest(db.id), EntryNode(cts, 0, db.name))
                )
            elif kind == "db_drop":
                db = op[1]
                db.delete_ts = cts
                _set_key(undo, cat.db_name_ts, db.name, cts)
                undo.append(("drop", db))
                cmds.append(
                    UpdateCatalog(
                        CatalogKind.DATABASE, Dest(db.id), EntryNode(db.create_ts, cts, db.name)
                    )
                )
            elif kind == "tbl_create":
                t, schema = op[1], op[2]
                t.create_ts = cts
                t.schemas.append((cts, schema))
                _set_attr(undo, t, "ddl_ts", cts)
                _set_key(undo, t.db.name_ts, t.name, cts)
                _set_attr(undo, t.db, "child_ts", cts)
                undo.append(("create", t))
                cmds.append(
                    UpdateCatalog(
                        CatalogKind.TABLE,
                        Dest(t.db.id, t.id),
                        EntryNode(cts, 0, t.name, schema=schema),
                    )
                )
            elif kind == "tbl_alter":
                t, schema = op[1], op[2]
                t.schemas.append((cts, schema))
                _set_attr(undo, t, "ddl_ts", cts)
                undo.append(("alter", (t, (cts, schema))))
                cmds.append(
                    UpdateCatalog(
                        CatalogKind.TABLE,
                        Dest(t.db.id, t.id),
                        EntryNode(t.create_ts, 0, t.name, schema=schema),
                    )
                )
            elif kind == "tbl_drop":
                t = op[1]
                t.delete_ts = cts
                _set_attr(undo, t, "ddl_ts", cts)
                _set_key(undo, t.db.name_ts, t.name, cts)
                _set_attr(undo, t.db, "child_ts", cts)
                undo.append(("drop", t))
                cmds.append(
                    UpdateCatalog(
                        CatalogKind.TABLE, Dest(t.db.id, t.id), EntryNode(t.create_ts, cts, t.name)
                    )
                )
        for t, dels in txn.deletes.items():
            by_block: dict[BlockNode, list[int]] = {}
            for _, blk, row in dels:
                by_block.setdefault(blk, []).append(row)
            for blk, rows in by_block.items():
                dest = memo.get(blk.id)
                if dest is None:
                    dest = memo[blk.id] = Dest(t.db.id, t.id, blk.segment.id, blk.id)
                cmds.append(Delete(dest, tuple(sorted(rows))))

    # -- step 4 ----------------------------------------------------------------------------
    def _on_log(self, rec: _InFlight, lf: Future[int]) -> None:
        exc = lf.exception()
        with self._vis:
            if exc is not None:
                rec.state = _FAILED
                rec.error = exc
            else:
                rec.state = _DURABLE
            if self._draining:
                return
            self._draining = True
        self._drain()

    def _drain(self) -> None:
        while True:
            done: list[_InFlight] = []
            with self._vis:
                q = self._inflight
                while q and q[0].state != _PENDING:
                    rec = q.popleft()
                    if rec.state == _DURABLE and self.failed is None:
                        self._make_visible(rec)
                        self.visible_ts = rec.cts
                    else:
                        if self.failed is None:
                            self.failed = LogFailedError(
                                "log_failed", f"WAL append failed: {rec.error!r}"
                            )
                            self.failed.__cause__ = rec.error  # what the log said
                            log.error(
                                "WAL append failed; failing every later in-flight commit: %r",
                                rec.error,
                            )
                        rec.state = _FAILED
                        self._undo(rec)
                    done.append(rec)
                if not done:
                    self._draining = False
                    return
                if self._waiters:
                    self._vis_cond.notify_all()
            for rec in done:
                self._slots.release()
                if rec.state == _DURABLE and rec.txn is None:
                    for hb in self.heartbeat_listeners:
                        try:
                            hb(rec.cts)
                        except Exception:
                            log.exception("heartbeat listener failed")
                    rec.future.set_result(rec.cts)
                elif rec.state == _DURABLE:
                    assert rec.txn is not None and rec.entry is not None
                    rec.txn.mark("committed")
                    for fn in self.listeners:
                        try:
                            fn(rec.entry)
                        except Exception:
                            log.exception("commit listener failed")
                    rec.future.set_result(rec.cts)
                else:
                    if rec.txn is not None:
                        rec.txn.mark("aborted")
                    failed = self.failed
                    assert failed is not None
                    if rec.error is not None:
                        err = LogFailedError("log_failed", f"WAL append failed: {rec.error!r}")
                    else:
                        err = LogFailedError(
                            "log_failed", f"an earlier WAL append failed: {failed.message}"
                        )
                    rec.future.set_exception(err)

    @staticmethod
    def _make_visible(rec: _InFlight) -> None:
        cts = rec.cts
        txn = rec.txn
        if txn is None:
            return
        for blk, row0, n in txn.ranges:
            blk.mem.set_cts(row0, n, cts)
        for dels in txn.deletes.values():
            for _, blk, row in dels:
                blk.mem.dts[row] = cts

    def _undo(self, rec: _InFlight) -> None:
        if rec.txn is None:
            return
        for blk, row0, n in rec.txn.ranges:
            blk.mem.set_cts(row0, n, ABORTED_TS)
        self._undo_catalog(rec)

    def _undo_catalog(self, rec: _InFlight) -> None:
        for what, x in reversed(rec.undo):
            if what == "create":
                x.create_ts = MAX_TS
            elif what == "drop":
                x.delete_ts = MAX_TS
            elif what == "alter":
                t, version = x
                if version in t.schemas:
                    t.schemas.remove(version)
            elif what == "attr":
                obj, name, old = x
                setattr(obj, name, old)
            elif what == "key":
                d, key, old = x
                if old is None:
                    d.pop(key, None)
                else:
                    d[key] = old
        for node in rec.txn.new_nodes if rec.txn is not None else ():
            if node.create_ts == MAX_TS:
                self._catalog.forget(node)

    # -- readers ----------------------------------------------------------------------------
    def wait_visible(self, ts: int, timeout: float | None = None) -> bool:
        """Wait until no queued transaction with CommitTS <= ts is still in flight.

        Taking the pipeline lock first makes sure a transaction that drew its CommitTS
        (<= ts) before the caller drew ts is already in the queue."""
        with self._lock:
            pass
        with self._vis:
            self._waiters += 1
            try:
                return self._vis_cond.wait_for(
                    lambda: not self._inflight or self._inflight[0].cts > ts, timeout
                )
            finally:
                self._waiters -= 1

    def in_flight(self) -> int:
        with self._vis:
            return len(self._inflight)

    def close(self, timeout: float | None = 30.0) -> None:
        """Refuse new commits, finish the queued ones (up to `timeout` seconds)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        with self._vis:
            self._waiters += 1
            try:
                self._vis_cond.wait_for(lambda: not self._queue and not self._inflight, timeout)
            finally:
                self._waiters -= 1
        self._stop = True
        self._work.set()
