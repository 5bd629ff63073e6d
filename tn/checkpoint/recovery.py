"""Recovery (DESIGN "Data flow" 7): newest complete manifest -> catalog and block index
rebuilt from object storage -> WAL replayed from the manifest's LSN.

Blocks whose object holds every row they will ever have are loaded without reading
anything: their rows become views over their objects (tn.memtable.flushed), their
keys are found through their key filter objects, loaded at the first lookup
(docs/memory.md); the key index holds only the keys of rows still in memory.
Other blocks (still open at the checkpoint) are loaded whole, at their row offsets,
so the WAL after the checkpoint lands where it landed before (physical replay).
Recovery reads no WAL before the checkpoint, and no column of flushed blocks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infra.collector import collector_paused
from infra.objectstore import ObjectStore
from schemas.codec import decode_entry
from schemas.logtail import COMMIT_TS, LARGE_TXN_SUFFIX, ROW_ID
from schemas.wal import UpdateCatalog
from tn.catalog.nodes import ABORTED_TS, MAX_TS, BlockNode, DatabaseNode, SegmentNode, TableNode
from tn.checkpoint.dump import BlockReader, column_ids, from_parquet
from tn.checkpoint.exceptions import CheckpointError
from tn.checkpoint.manifest import CatalogSnapshot, Manifest, newest_manifest, schema_in
from tn.checkpoint.runner import CheckpointRunner, Touched
from tn.engine import Engine
from tn.logstore.driver import LogRecord, LogStore
from tn.memtable.block import BLOCK_ROWS, DroppedCols, MemBlock
from tn.memtable.columns import new_column
from tn.replay import apply_entry, apply_groups, in_chunks

_MASK = (1 << 16) - 1


@dataclass
class Recovered:
    engine: Engine
    store: ObjectStore
    manifest: Manifest | None
    touched: list[Touched] = field(default_factory=list)
    replayed: int = 0
    load_s: float = 0.0
    replay_s: float = 0.0

    def runner(self, **kw: Any) -> CheckpointRunner:
        """The checkpoint runner continuing from this recovery."""
        return CheckpointRunner(
            self.engine, self.store, last=self.manifest, touched=self.touched, **kw
        )


def recover(log: LogStore, store: ObjectStore, **engine_kw: Any) -> Recovered:
    # Recovery allocates millions of long-lived objects (key index, row metadata): the
    # cyclic GC would rescan them over and over; it is paused meanwhile, and what
    # recovery built is frozen (never rescanned) afterwards.
    with collector_paused(freeze_after=True):
        return _recover(log, store, **engine_kw)


def _recover(
    log: LogStore,
    store: ObjectStore,
    bits_per_key: int = 10,
    cache_blocks: int = 32,
    **engine_kw: Any,
) -> Recovered:
    t0 = time.perf_counter()
    engine = Engine(log, **engine_kw)
    engine.block_columns = BlockReader(store, cache_blocks, bits_per_key)
    engine.catalog.objects = engine.block_columns
    engine.catalog.block_loader = BlockLoader(store)
    m = newest_manifest(store)
    if m is not None:
        check_manifest_fits(m, log)
        snap = CatalogSnapshot.decode(store.get(m.catalog))
        load_catalog(engine, snap, store)
    t1 = time.perf_counter()
    rec = Recovered(engine, store, m, load_s=t1 - t0)
    cat = engine.catalog
    max_id = 0
    last_ts = m.ts if m is not None else 0
    from_lsn = m.lsn + 1 if m is not None else None
    touched = rec.touched
    # records a chunk at a time where the log stores entries in groups (`apply_groups`),
    # else entry by entry
    for r in in_chunks(log.runs(from_lsn)):
        if not isinstance(r, LogRecord):
            done = apply_groups(cat, r)
            max_id = max(max_id, done.max_id)
            last_ts = max(last_ts, done.last_ts)
            touched.extend(map(Touched, done.cts, done.lsns, done.memos))
            rec.replayed += len(done.lsns)
            continue
        entry = decode_entry(r.payload)
        max_id = max(max_id, apply_entry(cat, entry))
        cts = entry.txn.commit_ts
        last_ts = max(last_ts, cts)
        touched.append(Touched(cts, entry.lsn, tuple(d.block_id for d in entry.txn.memo)))
        rec.replayed += 1
    cat.reserve_ids(max_id)
    engine.clock.observe(last_ts)
    engine.pipeline.visible_ts = max(engine.pipeline.visible_ts, last_ts)
    rec.replay_s = time.perf_counter() - t1
    return rec


def check_manifest_fits(m: Manifest, log: LogStore) -> None:
    """Refuse a checkpoint that is not of this log: recovering it would silently mix another
    WAL's tables into this one, or skip entries this WAL never had."""
    here = log.driver.identity()
    if m.wal and here and m.wal != here:
        raise CheckpointError(
            f"the newest checkpoint in the object store ({m.key}) is of the WAL {m.wal!r}, "
            f"not of this WAL {here!r}: give each WAL its own object store or prefix "
            "([objectstore] url)"
        )
    if log.truncated() > m.lsn:
        raise CheckpointError(
            f"the WAL is truncated at {log.truncated()}, beyond the newest checkpoint's "
            f"LSN {m.lsn}: entries are missing"
        )
    if log.driver.last_lsn() < m.lsn:
        raise CheckpointError(
            f"the newest checkpoint ({m.key}) covers the WAL through LSN {m.lsn}, but this WAL "
            f"ends at LSN {log.driver.last_lsn()}: the checkpoint is of another WAL, or this "
            "WAL lost entries"
        )


def load_catalog(engine: Engine, snap: CatalogSnapshot, store: ObjectStore) -> None:
    cat = engine.catalog
    reader = cat.objects
    if reader is None:
        reader = cat.objects = BlockReader(store)
    for d in sorted(snap.databases, key=lambda x: x["id"]):
        db = cat.add_database(d["name"], node_id=d["id"])
        db.create_ts = d["create_ts"]
        cat.db_name_ts[db.name] = d["create_ts"]
        if d["delete_ts"]:
            db.delete_ts = d["delete_ts"]
            cat.db_name_ts[db.name] = d["delete_ts"]
    for d in sorted(snap.tables, key=lambda x: x["id"]):
        parent = cat.nodes[d["db_id"]]
        assert isinstance(parent, DatabaseNode)
        t = cat.add_table(parent, d["name"], node_id=d["id"])
        t.create_ts = d["create_ts"]
        t.schemas = [(int(ts), schema_in(s)) for ts, s in d["schemas"]]
        t.ddl_ts = t.schemas[-1][0]
        last = d["create_ts"]
        if d["delete_ts"]:
            t.delete_ts = t.ddl_ts = last = d["delete_ts"]
        parent.name_ts[t.name] = max(parent.name_ts.get(t.name, 0), last)
        parent.child_ts = max(parent.child_ts, last)
    for d in sorted(snap.segments, key=lambda x: x["id"]):
        tn = cat.nodes[d["table_id"]]
        assert isinstance(tn, TableNode)
        seg = SegmentNode(d["id"], tn)
        seg.create_ts = d["create_ts"]
        if d["delete_ts"]:
            seg.delete_ts = d["delete_ts"]
        tn.mem.add_segment(seg)
        cat.register(seg)
    for b in sorted(snap.blocks, key=lambda x: x.id):
        sn = cat.nodes[b.segment_id]
        assert isinstance(sn, SegmentNode)
        blk = BlockNode(b.id, sn, MemBlock())
        blk.create_ts = b.create_ts
        if b.delete_ts:
            blk.delete_ts = b.delete_ts
        blk.meta_loc, blk.delta_loc = b.meta_loc, b.delta_loc
        blk.pk_loc = b.pk_loc
        if b.meta_loc and b.complete:
            # nothing read: the rows stay in the objects, the keys behind the filter
            flush_block(blk, reader)
            sn.table.mem.register_flushed(blk)
        elif b.meta_loc:
            load_block(blk, store, columns=True)
        sn.table.mem.add_block(blk)
        cat.register(blk)
    cat.reserve_ids(snap.max_id)
    for node in list(cat.nodes.values()):
        if isinstance(node, TableNode):
            rebuild_index(node)
    engine.clock.observe(snap.ts)
    engine.pipeline.visible_ts = snap.ts


def flush_block(blk: BlockNode, reader: Any, override: int = 0) -> None:
    """blk's rows as views over its objects (complete: BLOCK_ROWS offsets); a large
    transaction's object has its rows' commit ts only in the catalog (its create ts)."""
    t = blk.segment.table
    if not override and blk.meta_loc.endswith(LARGE_TXN_SUFFIX):
        override = blk.create_ts
    blk.mem.flush(reader, blk.meta_loc, blk.delta_loc, t.mem.pk_cid(), override, n=BLOCK_ROWS)


def load_block(blk: BlockNode, store: ObjectStore, *, columns: bool, cts_override: int = 0) -> None:
    """Fill blk.mem from its objects: commit ts, delete ts, and the key column (all
    columns when `columns`, else DroppedCols)."""
    t = blk.segment.table
    schema = t.schemas[-1][1]
    pk_cid = schema.column(schema.primary_key).column_id
    data = from_parquet(store.get(blk.meta_loc))
    ids = column_ids(data)
    offs = np.asarray(data.column(ROW_ID).to_numpy(), dtype=np.int64) & _MASK
    n = BLOCK_ROWS if not columns else (int(offs.max()) + 1 if len(offs) else 0)
    cts = np.full(n, ABORTED_TS, dtype=np.int64)
    cts[offs] = cts_override if cts_override else data.column(COMMIT_TS).to_numpy()
    dts = np.full(n, MAX_TS, dtype=np.int64)
    if blk.delta_loc:
        delta = from_parquet(store.get(blk.delta_loc))
        doffs = np.asarray(delta.column(ROW_ID).to_numpy(), dtype=np.int64) & _MASK
        dts[doffs] = delta.column(COMMIT_TS).to_numpy()
    types = t.mem.column_types()
    cols: dict[int, Any] = {}
    for name, cid in ids.items():
        if not columns and cid != pk_cid:
            continue
        arr = data.column(name)
        vals: list[Any] = [None] * n
        for o, v in zip(offs.tolist(), arr.to_pylist(), strict=True):
            vals[o] = v
        col = new_column(types.get(cid, arr.type))
        col.put(0, vals, 0, n)
        cols[cid] = col
    blk.mem.load(cts, dts, cols if columns else DroppedCols(blk.meta_loc, cols, n=n))


def rebuild_index(t: TableNode) -> None:
    """The primary-key index from the rows still in memory: key -> newest write (a key's
    live row, else its latest delete), block by block."""
    schema = t.schemas[-1][1]
    pk_cid = schema.column(schema.primary_key).column_id
    mem_t = t.mem
    idx = mem_t.index
    for blk in mem_t.blocks:
        if blk.delete_ts != MAX_TS or blk.mem.flushed:
            continue  # flushed blocks' keys are found through their filters
        mem = blk.mem
        col = mem.cols.get(pk_cid)
        if col is None:
            continue
        n = len(mem)
        keys = col[:n]
        cts = np.asarray(mem.cts[:n], dtype=np.int64)
        dts = np.asarray(mem.dts[:n], dtype=np.int64)
        ok = cts < ABORTED_TS
        with mem_t.index_lock:
            live = np.flatnonzero(ok & (dts == MAX_TS))
            if len(live):
                idx.set_many([keys[r] for r in live.tolist()], blk.id, live, cts[live], True)
            dead = np.flatnonzero(ok & (dts != MAX_TS))
            if not len(dead):
                continue
            dead = dead[np.argsort(dts[dead], kind="stable")]  # the latest delete last
            dk = [keys[r] for r in dead.tolist()]
            take = [
                i
                for i, e in enumerate(idx.get_many(dk))
                if e is None or (not e[3] and e[2] < int(dts[dead[i]]))
            ]
            if take:
                sel = dead[take]
                idx.set_many([dk[i] for i in take], blk.id, sel, dts[sel], False)


class BlockLoader:
    """`Catalog.block_loader`: replay of a block created with its rows in object storage
    (compact, merge, large transaction)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def __call__(self, blk: BlockNode, cmd: UpdateCatalog, cts: int) -> None:
        from tn.checkpoint.compaction import apply_object_block

        apply_object_block(blk, cmd, cts, self.store)
