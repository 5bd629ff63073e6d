"""Checkpoints (seed 003/004 "Checkpoint", DESIGN "Data flow" 6): numbered, idempotent steps.

1. read the logtail's positions (`logtail_offsets`, the publisher's acknowledged
   ends, merged over the previous manifest's), THEN pick t1: a heartbeat's ts (no
   transaction is still committing below it). Read in that order, every logtail
   record with commit ts > t1 lies at or above the positions (tn.logtail.publisher,
   step 5): a CN bootstrapping from this checkpoint follows each topic from there;
2. dump every block changed in (t0, t1] -- from the per-transaction memo of touched
   blocks -- to object storage: its rows with commit ts <= t1 (Parquet) and, when it
   has deletes, a delta object (cumulative, deletes with ts <= t1). Keys are derived
   from (block, t1), so redoing the step rewrites the same objects;
3. record metaLoc/deltaLoc through one catalog-update WAL entry (reason FLUSH), then
   drop the dumped blocks' rows from memory where the object has every row the block
   will ever hold (a full block, nothing pending); reads then load the object;
4. write the catalog as of t1, then the manifest (t1, the LSN of the last transaction
   with commit ts <= t1, the objects) -- LAST: a manifest means a complete checkpoint;
   then push BlockMeta/Checkpoint records on the logtail topics (optional publisher);
5. truncate the WAL up to that LSN, then the logtail topics below the PREVIOUS
   checkpoint's positions (`truncate_logtail`): a CN lagging by less than one
   checkpoint interval never loses its place; one lagging more bootstraps again.

A crash between any two steps leaves either no new manifest (recovery uses the
previous one and replays the WAL, which still has everything after it) or a
complete one. The next checkpoint redoes the work from the last complete t0.
`hook(step)` is called after each step (tests inject crashes there).

Construct the runner right after the engine is created or recovered, before new
commits: it takes the LSNs already in the engine as covered by the first checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from infra.objectstore import ObjectStore
from schemas.logtail import BlockMeta, Checkpoint, LogtailRecord
from schemas.wal import (
    CatalogKind,
    CatalogReason,
    Command,
    Dest,
    EntryNode,
    UpdateCatalog,
    WalEntry,
)
from tn.catalog.nodes import ABORTED_TS, MAX_TS, BlockNode, DatabaseNode, SegmentNode, TableNode
from tn.checkpoint.dump import (
    BlockReader,
    dump_data,
    dump_delta,
    filter_key,
    settled,
    table_columns,
    to_parquet,
)
from tn.checkpoint.manifest import (
    BlockEntry,
    CatalogSnapshot,
    Manifest,
    catalog_key,
    schema_out,
)
from tn.checkpoint.release import release_free_memory
from tn.memtable.block import BLOCK_ROWS, DroppedCols
from tn.memtable.flushed import FlushedDts, loc_ts
from tn.memtable.pk_filter import KeyFilter, filter_bits

__all__ = ["CheckpointRunner", "Touched", "block_complete", "data_key", "delta_key", "loc_ts"]

log = logging.getLogger(__name__)

STEPS = ("pick", "dump_one", "dump", "flush", "drop", "catalog", "manifest", "truncate")


@dataclass(frozen=True, slots=True)
class Touched:
    cts: int
    lsn: int
    blocks: tuple[int, ...]


def data_key(table_id: int, block_id: int, ts: int) -> str:
    return f"data/{table_id}/{block_id}-{ts:020d}.parquet"


def delta_key(table_id: int, block_id: int, ts: int) -> str:
    return f"data/{table_id}/{block_id}-{ts:020d}.delta.parquet"


def block_complete(blk: BlockNode, data_ts: int) -> bool:
    """Whether the object dumped at data_ts holds every row the block will ever have."""
    mem = blk.mem
    if isinstance(mem.cols, DroppedCols):
        return True
    n = len(mem)
    if n < BLOCK_ROWS or not data_ts:
        return False
    cts = np.array(mem.cts[:n], dtype=np.int64)
    return settled(cts, data_ts)


class CheckpointRunner:
    def __init__(
        self,
        engine: Any,
        store: ObjectStore,
        *,
        last: Manifest | None = None,
        touched: list[Touched] | None = None,
        interval_s: float = 60.0,
        wal_bytes: int = 256 << 20,
        wal_entries: int = 0,
        drop_memory: bool = True,
        hook: Callable[[str], None] | None = None,
        publish: Callable[[list[LogtailRecord]], None] | None = None,
        logtail_offsets: Callable[[], dict[str, int]] | None = None,
        truncate_logtail: Callable[[dict[str, int]], None] | None = None,
        put_workers: int = 8,
    ) -> None:
        self.engine = engine
        self.store = store
        self.last = last
        self.interval_s = interval_s
        self.wal_bytes = wal_bytes
        self.wal_entries = wal_entries
        self.drop_memory = drop_memory
        self.hook = hook
        self.publish = publish
        self.logtail_offsets = logtail_offsets
        self.truncate_logtail = truncate_logtail
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._touched: list[Touched] = list(touched or [])
        # every entry already in the engine is covered by the first checkpoint
        self._base_lsn = engine.log.next_lsn() - 1
        # without a recovered memo index (fresh engine / full replay), the first
        # checkpoint dumps every block
        self._full_scan = touched is None
        # full blocks the last checkpoint left in memory for rows of transactions still
        # running: one that then rolls back touches the block in no commit, so the memo
        # would never name it again (`_revisit`)
        self._unsettled: set[int] = set()
        self._sizes: dict[str, int] = dict(last.objects) if last is not None else {}
        self._wal_since = 0  # bytes of WAL entries since the last checkpoint (approx.)
        self._entries_since = 0
        self.checkpoints = 0
        self.pruned = 0  # key index entries dropped (of flushed rows)
        self.releases = 0  # times freed memory went back to the OS after dropping rows
        self.put_workers = put_workers
        self.errors: list[str] = []
        if engine.block_columns is None:
            engine.block_columns = BlockReader(store)
        if engine.catalog.objects is None and isinstance(engine.block_columns, BlockReader):
            engine.catalog.objects = engine.block_columns
        engine.add_commit_listener(self._on_commit)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the logtail manager's memo index (commit listener) ---------------------------
    def _on_commit(self, entry: WalEntry) -> None:
        t = Touched(entry.txn.commit_ts, entry.lsn, tuple(d.block_id for d in entry.txn.memo))
        with self._lock:
            self._touched.append(t)
            self._entries_since += 1
            self._wal_since += 64 + sum(
                len(getattr(c, "batch", b"")) + 8 * len(getattr(c, "rows", ()))
                for c in entry.commands
            )

    def oldest_uncovered_ts(self) -> int:
        """The commit ts of the oldest WAL entry no checkpoint covers yet (0: none)."""
        t0 = self.last.ts if self.last is not None else 0
        with self._lock:
            return min((e.cts for e in self._touched if e.cts > t0), default=0)

    def wal_since(self) -> tuple[int, int]:
        """(entries, approximate bytes) committed since the last checkpoint began."""
        with self._lock:
            return self._entries_since, self._wal_since

    @property
    def exclusive(self) -> threading.Lock:
        """Held while a checkpoint runs: whoever rewrites flushed blocks (the scheduled
        compaction) holds it too, so a checkpoint never dumps a block being replaced."""
        return self._run_lock

    def _step(self, name: str) -> None:
        if self.hook is not None:
            self.hook(name)

    # -- one checkpoint ----------------------------------------------------------------
    def checkpoint(self) -> Manifest | None:
        """Take one checkpoint; None when nothing changed since the last one."""
        with self._run_lock:
            return self._checkpoint()

    def _checkpoint(self) -> Manifest | None:
        eng = self.engine
        t0 = self.last.ts if self.last is not None else 0
        prev_lsn = self.last.lsn if self.last is not None else 0
        # (1) the logtail's positions, then t1 (in this order: see step 1 above)
        offsets = dict(self.last.logtail_offsets) if self.last is not None else {}
        if self.logtail_offsets is not None:
            for topic, end in self.logtail_offsets().items():
                offsets[topic] = max(offsets.get(topic, 0), end)
        t1 = eng.heartbeat().result()
        with self._lock:
            entries = [e for e in self._touched if t0 < e.cts <= t1]
            self._entries_since = 0
            self._wal_since = 0
        self._step("pick")
        lsn = max([e.lsn for e in entries] + [self._base_lsn, prev_lsn])
        cat = eng.catalog
        with cat.lock:
            nodes = list(cat.nodes.values())
        if self._full_scan:
            dirty = [n for n in nodes if isinstance(n, BlockNode) and n.create_ts <= t1]
        else:
            ids = {b for e in entries for b in e.blocks} | self._revisit(cat)
            dirty = [n for n in nodes if isinstance(n, BlockNode) and n.id in ids]
        if not dirty and lsn == prev_lsn and self.last is not None:
            return None
        # (2) dump
        with ThreadPoolExecutor(self.put_workers, thread_name_prefix="kwal-ckpt-put") as pool:
            return self._checkpoint_with(pool, t0, t1, lsn, prev_lsn, dirty, offsets)

    def _revisit(self, cat: Any) -> set[int]:
        """The unsettled blocks of the last checkpoints whose transactions have all ended
        since (committed or rolled back): the dump then decides again, from the block's
        rows and objects as they are (also when the checkpoint that left it failed)."""
        out = set()
        for bid in list(self._unsettled):
            blk = cat.nodes.get(bid)
            if not isinstance(blk, BlockNode) or blk.mem.flushed:
                self._unsettled.discard(bid)
            elif blk.mem.running_row() is None:
                out.add(bid)
        return out

    def _checkpoint_with(
        self,
        pool: ThreadPoolExecutor,
        t0: int,
        t1: int,
        lsn: int,
        prev_lsn: int,
        dirty: list[BlockNode],
        offsets: dict[str, int],
    ) -> Manifest:
        """Steps 2-5. Objects are put by `pool` (each put waits for the store: a fsync, a
        PUT's round trip), all of them done before step 3 names them; the blocks'
        filters are written and their rows dropped by the pool too."""
        eng = self.engine
        store = self.store
        written: list[str] = []
        flushes: list[tuple[BlockNode, str, str]] = []
        complete: set[int] = set()
        puts: list[Future[None]] = []

        def drain() -> None:
            for f in puts:
                f.result()
            puts.clear()

        for blk in sorted(dirty, key=lambda b: b.id):
            t = blk.segment.table
            n = len(blk.mem)
            cts = np.array(blk.mem.cts[:n], dtype=np.int64)
            dts = np.array(blk.mem.dts[:n], dtype=np.int64)
            data_ts = loc_ts(blk.meta_loc)
            meta = blk.meta_loc
            if not meta or bool(np.any((cts > data_ts) & (cts <= t1))):
                table, full = dump_data(blk, t1, table_columns(t, t1), eng.block_columns)
                meta = data_key(t.id, blk.id, t1)
                puts.append(pool.submit(self._put, meta, to_parquet(table)))
                written.append(meta)
                if full:
                    complete.add(blk.id)
            elif block_complete(blk, data_ts):
                complete.add(blk.id)
            delta = blk.delta_loc
            if bool(np.any((dts > loc_ts(delta)) & (dts <= t1))):
                delta = delta_key(t.id, blk.id, t1)
                puts.append(pool.submit(self._put, delta, to_parquet(dump_delta(blk, t1))))
                written.append(delta)
            if meta != blk.meta_loc or delta != blk.delta_loc:
                flushes.append((blk, meta, delta))
            if blk.id in complete or len(blk.mem) < BLOCK_ROWS:
                self._unsettled.discard(blk.id)
            else:
                self._unsettled.add(blk.id)
            if len(written) <= 2 and self.hook is not None:
                drain()  # the first block's objects are in the store at this step
                self._step("dump_one")
        drain()
        self._step("dump")
        # (3) metaLoc/deltaLoc through a catalog-update WAL entry
        if flushes:
            txn = eng.begin()
            txn.system_op(lambda cts: _flush_commands(flushes))
            txn.commit().result()
        for blk, _, delta in flushes:
            if isinstance(blk.mem.dts, FlushedDts):
                blk.mem.dts.rebase(delta, t1)  # the new delta object has the deletes <= t1
        self._step("flush")
        if self.drop_memory:
            drop = [
                b for b in dirty if b.id in complete and b.meta_loc and not b.mem.flushed
            ]
            for f in [pool.submit(drop_block_memory, b, store, eng) for b in drop]:
                written.extend(f.result())
            dropped = sum(1 for b in drop if b.mem.flushed)
            # (3b) the key index keeps what conflict checks still need: entries newer
            # than the oldest active transaction's StartTS, or of rows in memory
            upto = eng.catalog.oldest_start(t1)
            for t in {b.segment.table for b in dirty} | _tables(eng):
                self.pruned += t.mem.prune(min(upto, t1))
            # (3c) the dropped rows' memory back to the OS (tn.checkpoint.release)
            if dropped:
                release_free_memory()
                self.releases += 1
        self._step("drop")
        # (4) catalog as of t1, then the manifest
        snap = catalog_snapshot(eng, t1, {b.id: (m, d) for b, m, d in flushes})
        ckey = catalog_key(t1)
        store.put(ckey, snap.encode())
        self._step("catalog")
        live = {}
        for b in snap.blocks:
            if b.delete_ts:
                continue
            for loc in (b.meta_loc, b.delta_loc, b.pk_loc):
                if loc:
                    live[loc] = self._size(loc)
        m = Manifest(
            t1, lsn, t0, ckey, live, written, offsets, time.time(), eng.log.driver.identity()
        )
        store.put(m.key, m.encode())
        self._step("manifest")
        if self.publish is not None:
            try:
                self.publish(_logtail_records(eng, flushes, m, t1))
            except Exception as e:  # the logtail is best effort; the manifest is the truth
                log.exception("publishing the checkpoint's logtail failed")
                self.errors.append(repr(e))
        # (5) truncate
        if lsn > eng.log.truncated():
            eng.log.truncate(lsn)
        if self.truncate_logtail is not None and self.last is not None:
            try:
                self.truncate_logtail(self.last.logtail_offsets)
            except Exception as e:  # the logtail keeps its records; retried next time
                log.exception("truncating the logtail topics failed")
                self.errors.append(repr(e))
        self._step("truncate")
        self.last = m
        self._full_scan = False
        with self._lock:
            self._touched = [e for e in self._touched if e.cts > t1]
        self._sizes = dict(live)
        self.checkpoints += 1
        return m

    def _put(self, key: str, data: bytes) -> None:
        self.store.put(key, data)
        self._sizes[key] = len(data)

    def _size(self, key: str) -> int:
        s = self._sizes.get(key)
        if s is None:
            s = self._sizes[key] = self.store.size(key)
        return s

    # -- background task -----------------------------------------------------------------
    def due(self, since: float) -> bool:
        entries, nbytes = self.wal_since()
        if self.wal_entries and entries >= self.wal_entries:
            return True
        if nbytes >= self.wal_bytes:
            return True
        return time.monotonic() - since >= self.interval_s

    def start(self, poll_s: float = 0.2) -> CheckpointRunner:
        def loop() -> None:
            since = time.monotonic()
            while not self._stop.wait(poll_s):
                if not self.due(since):
                    continue
                try:
                    self.checkpoint()
                except Exception as e:
                    log.exception("checkpoint failed")
                    self.errors.append(repr(e))
                since = time.monotonic()

        self._thread = threading.Thread(target=loop, name="kwal-checkpoint", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        try:
            self.engine.remove_commit_listener(self._on_commit)
        except ValueError:
            pass


def _flush_commands(flushes: list[tuple[BlockNode, str, str]]) -> list[Command]:
    out: list[Command] = []
    for blk, meta, delta in flushes:
        seg = blk.segment
        t = seg.table
        blk.meta_loc = meta
        blk.delta_loc = delta
        out.append(
            UpdateCatalog(
                CatalogKind.BLOCK,
                Dest(t.db.id, t.id, seg.id, blk.id),
                EntryNode(
                    blk.create_ts,
                    0 if blk.delete_ts == MAX_TS else blk.delete_ts,
                    meta_loc=meta,
                    delta_loc=delta,
                ),
                CatalogReason.FLUSH,
            )
        )
    return out


def drop_block_memory(blk: BlockNode, store: ObjectStore | None = None, eng: Any = None) -> list[str]:
    """Replace a complete, dumped block's rows in memory by views over its objects
    (MemBlock.flush), after writing its key filter object next to its data object
    (with `store`); the table then finds its keys through that filter. Returns the
    objects written."""
    t = blk.segment.table
    mem = blk.mem
    if mem.flushed:
        return []
    reader = eng.catalog.objects if eng is not None else None
    pk = t.mem.pk_cid()
    if reader is None or store is None:  # no object reader: the old way (key kept)
        with t.mem.lock:
            cols = mem.cols
            if not isinstance(cols, DroppedCols):
                kept = {pk: cols[pk]} if pk in cols else {}
                mem.cols = DroppedCols(blk.meta_loc, kept, n=len(mem))
        return []
    n = len(mem)
    keys = mem.cols.get(pk, [])[:n]
    cts = np.asarray(mem.cts[:n], dtype=np.int64)
    present = [k for k, c in zip(keys, (cts < ABORTED_TS).tolist(), strict=False) if c]
    flt = KeyFilter.build(present, filter_bits(BLOCK_ROWS, reader.bits_per_key))
    pk_loc = filter_key(blk.meta_loc)
    store.put(pk_loc, flt.encode())
    blk.pk_loc = pk_loc
    # the pipeline's visibility step writes delete ts into blocks: not during the swap
    vis = getattr(eng.pipeline, "_vis", None)
    with t.mem.lock, (vis if vis is not None else contextlib.nullcontext()):
        mem.flush(reader, blk.meta_loc, blk.delta_loc, pk, n=n)
    t.mem.register_flushed(blk, flt, keys=present)  # the next prune drops their entries
    return [pk_loc]


def _tables(eng: Any) -> set[TableNode]:
    cat = eng.catalog
    with cat.lock:
        return {n for n in cat.nodes.values() if isinstance(n, TableNode)}


def _ts(v: int) -> int:
    return 0 if v == MAX_TS else v


def catalog_snapshot(eng: Any, t1: int, fresh: dict[int, tuple[str, str]]) -> CatalogSnapshot:
    """The committed catalog as of t1 (nodes created <= t1; deletes after t1 omitted)."""
    cat = eng.catalog
    with cat.lock:
        nodes = sorted(cat.nodes.values(), key=lambda n: n.id)
    snap = CatalogSnapshot(t1, max((n.id for n in nodes), default=0))

    def dts(v: int) -> int:
        return v if v <= t1 else 0

    for n in nodes:
        if n.create_ts > t1:
            continue
        if isinstance(n, DatabaseNode):
            snap.databases.append(
                {
                    "id": n.id,
                    "name": n.name,
                    "create_ts": n.create_ts,
                    "delete_ts": dts(n.delete_ts),
                }
            )
        elif isinstance(n, TableNode):
            snap.tables.append(
                {
                    "id": n.id,
                    "db_id": n.db.id,
                    "name": n.name,
                    "create_ts": n.create_ts,
                    "delete_ts": dts(n.delete_ts),
                    "schemas": [[ts, schema_out(s)] for ts, s in n.schemas if ts <= t1],
                }
            )
        elif isinstance(n, SegmentNode):
            snap.segments.append(
                {
                    "id": n.id,
                    "table_id": n.table.id,
                    "create_ts": n.create_ts,
                    "delete_ts": dts(n.delete_ts),
                }
            )
        elif isinstance(n, BlockNode):
            meta, delta = fresh.get(n.id, (n.meta_loc, n.delta_loc))
            data_ts = loc_ts(meta)
            snap.blocks.append(
                BlockEntry(
                    n.id,
                    n.segment.id,
                    n.segment.table.id,
                    n.create_ts,
                    dts(n.delete_ts),
                    meta,
                    delta,
                    data_ts,
                    min(len(n.mem), BLOCK_ROWS),
                    block_complete(n, data_ts) if meta else False,
                    n.pk_loc if n.pk_loc and meta == n.meta_loc else "",
                )
            )
    return snap


def _logtail_records(
    eng: Any, flushes: list[tuple[BlockNode, str, str]], m: Manifest, t1: int
) -> list[LogtailRecord]:
    out = []
    tables: dict[int, TableNode] = {}
    for blk, meta, delta in flushes:
        t = blk.segment.table
        tables[t.id] = t
        out.append(
            LogtailRecord(
                t.db.name,
                t.name,
                t1,
                BlockMeta(
                    blk.id,
                    meta,
                    t1 + 1,  # rows/deletes with ts <= t1 are in the objects
                    delta,
                    blk.create_ts,
                    _ts(blk.delete_ts) if blk.delete_ts <= t1 else 0,
                ),
                t.id,
            )
        )
    for t in tables.values():
        out.append(LogtailRecord(t.db.name, t.name, t1, Checkpoint(m.key), t.id))
    return out
