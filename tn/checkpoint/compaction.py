"""Compaction, merge (seed 004) and large transactions: metadata-only WAL entries.

- compact_block: a background transaction copies a flushed, complete block's rows
  live at its snapshot S, sorted by primary key, into a new block object; the WAL
  gets only UpdateCatalog commands (old block delete@C, new block create@C with
  metaLoc, reason COMPACT). Rows keep their commit ts, so reads at ts >= C see the
  same rows through the new block, reads at ts < C still use the old one.
- merge_segment: the same for every block of a segment whose blocks are all flushed
  and complete: their live rows sorted by key into new blocks of a new segment
  (reason MERGE); the old segment and blocks get delete@C.
- merge_blocks: the same for flushed, complete blocks of one table from any segments
  (what the scheduled policy, tn.checkpoint.policy, picks); a segment left without a
  live block gets delete@C too.
- attach_object (large transaction): a producer uploads a Parquet file with the
  table's columns to object storage and commits a metadata-only transaction: the
  TN validates it (object exists; columns and types match the schema; keys
  non-null, unique, not live in the table and not written concurrently), lays it
  out as block objects (`__row_id`, `__commit_ts`, columns) and logs only the new
  blocks' metadata (reason LARGE_TXN). The rows never enter the WAL or memtable
  (the key column does: the key index needs it).

Conflicts: a compaction moves keys; a transaction that wrote one of them after S
makes the compaction fail (ConflictError), and the compaction stamps the moved
keys' last-write ts with C, so a transaction that started before C and deletes or
updates one of them conflicts (retry) instead of deleting a row of the old block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from infra.objectstore import ObjectStore
from schemas.logtail import COMMIT_TS, LARGE_TXN_SUFFIX, ROW_ID, BlockMeta, LogtailRecord
from schemas.wal import (
    CatalogKind,
    CatalogReason,
    Command,
    Dest,
    EntryNode,
    TableSchema,
    UpdateCatalog,
)
from tn.catalog.nodes import ABORTED_TS, MAX_TS, BlockNode, SegmentNode, TableNode
from tn.checkpoint.dump import (
    OFFSET_BITS,
    aligned_columns,
    column_ids,
    from_parquet,
    table_columns,
    to_parquet,
)
from tn.checkpoint.exceptions import LargeTxnError
from tn.checkpoint.runner import block_complete, loc_ts
from tn.exceptions import ConflictError, TnError, ValidationError
from tn.memtable.block import BLOCK_ROWS, DroppedCols, MemBlock
from tn.memtable.pk_filter import KeyFilter, filter_bits
from tn.txn.rows import ARROW_TYPES

Publish = Callable[[list[LogtailRecord]], None]

MAX_OBJECT_ROWS = 16 * BLOCK_ROWS  # rows of one large transaction's object (bounds TN memory)


def _publish(publish: Publish | None, t: TableNode, blocks: list[BlockNode]) -> None:
    """BlockMeta records of the new (and deleted) blocks on the table's logtail topic,
    so CNs read the same objects (`LogtailPublisher.publish_records`)."""
    if publish is None:
        return
    recs = []
    for b in blocks:
        deleted = 0 if b.delete_ts == MAX_TS else b.delete_ts
        meta = BlockMeta(
            b.id, b.meta_loc, loc_ts(b.meta_loc) + 1, b.delta_loc, b.create_ts, deleted
        )
        recs.append(LogtailRecord(t.db.name, t.name, max(b.create_ts, deleted), meta, t.id))
    publish(recs)


def committed_table(engine: Any, database: str, table: str) -> tuple[TableNode, TableSchema]:
    """The table and its schema in the committed catalog; ValidationError when unknown."""
    ts = engine.visible_ts
    db = engine.catalog.database(database, ts)
    t = engine.catalog.table(db, table, ts) if db is not None else None
    if t is None:
        raise ValidationError("unknown_table", f"unknown table {database}.{table}")
    schema = t.schema_at(ts)
    assert schema is not None
    return t, schema


def compactable(blk: BlockNode) -> bool:
    """A live block whose object holds every row it will ever have (flushed, complete,
    its columns dropped from memory): the only kind a compaction may rewrite."""
    return (
        blk.delete_ts == MAX_TS
        and bool(blk.meta_loc)
        and block_complete(blk, loc_ts(blk.meta_loc))
        and isinstance(blk.mem.cols, DroppedCols)
    )


def _live_rows(engine: Any, blk: BlockNode, ts: int, t: TableNode) -> pa.Table:
    """The block's rows live at ts (user columns by object name + `__commit_ts`)."""
    mem = blk.mem
    n = len(mem)
    cts = np.array(mem.cts[:n], dtype=np.int64)
    dts = np.array(mem.dts[:n], dtype=np.int64)
    sel = np.nonzero((cts <= ts) & (dts > ts))[0]
    dropped = blk.mem.cols
    assert isinstance(dropped, DroppedCols)
    arrays = engine.block_columns(dropped.loc, n)
    idx = pa.array(sel, pa.int64())
    cols: dict[str, pa.Array] = {COMMIT_TS: pa.array(cts[sel], pa.int64())}
    for name, c in table_columns(t, ts):
        typ = ARROW_TYPES[c.type]
        arr = arrays.get(c.column_id)
        cols[name] = arr.take(idx).cast(typ) if arr is not None else pa.nulls(len(sel), typ)
    return pa.table(cols)


def _block_object(rows: pa.Table, block_id: int, t: TableNode, ts: int) -> pa.Table:
    """rows (`__commit_ts` + columns by name) laid out as block `block_id`'s object."""
    import json

    from tn.checkpoint.dump import COLUMNS_META

    n = rows.num_rows
    fields = [pa.field(ROW_ID, pa.int64()), pa.field(COMMIT_TS, pa.int64())]
    data = [
        pa.array((block_id << OFFSET_BITS) + np.arange(n, dtype=np.int64), pa.int64()),
        rows.column(COMMIT_TS).combine_chunks().cast(pa.int64()),
    ]
    mapping = {}
    for name, c in table_columns(t, ts):
        typ = ARROW_TYPES[c.type]
        fields.append(pa.field(name, typ))
        mapping[name] = c.column_id
        data.append(
            rows.column(name).combine_chunks().cast(typ)
            if name in rows.column_names
            else pa.nulls(n, typ)
        )
    schema = pa.schema(fields, metadata={COLUMNS_META: json.dumps(mapping).encode()})
    return pa.Table.from_arrays(data, schema=schema)


def _new_block_mem(
    blk: BlockNode, loc: str, keys: list[Any], cts: list[int], pk: int, override: int = 0
) -> None:
    """A block born in object storage: full (no appends), its rows views over `loc`
    (`override`: every row's commit ts, where the object's are not final), its keys
    behind a filter built from `keys`."""
    t = blk.segment.table
    reader = t.mem.objects()
    mem = blk.mem
    pad = BLOCK_ROWS - len(keys)
    if reader is None:  # no object reader (an engine without checkpoints): in memory
        mem.load(
            np.array(list(cts) + [ABORTED_TS] * pad, dtype=np.int64),
            np.full(BLOCK_ROWS, MAX_TS, dtype=np.int64),
            DroppedCols(loc, {pk: list(keys) + [None] * pad}, n=BLOCK_ROWS),
        )
        return
    mem.flush(reader, loc, "", pk, override, n=BLOCK_ROWS)
    mem.cts._present = len(keys)
    flt = KeyFilter.build(keys, filter_bits(BLOCK_ROWS, reader.bits_per_key))
    t.mem.register_flushed(blk, flt, keys=list(keys))  # the next prune drops the entries


def _rewrite(
    engine: Any,
    store: ObjectStore,
    t: TableNode,
    schema: TableSchema,
    old_blocks: list[BlockNode],
    rows: pa.Table,
    reason: CatalogReason,
    snapshot: int,
    new_segment: bool,
    drop_segments: Sequence[SegmentNode] = (),
    publish: Publish | None = None,
) -> int:
    """Commit the replacement of old_blocks by `rows` (sorted) in new blocks."""
    cat = engine.catalog
    pk_name = schema.primary_key
    pk = schema.column(pk_name).column_id
    rows = rows.sort_by([(pk_name, "ascending")])
    n = rows.num_rows
    seg = SegmentNode(cat.new_id(), t) if new_segment else old_blocks[0].segment
    plans: list[tuple[BlockNode, str, list[Any], list[int]]] = []
    for start in range(0, max(n, 1), BLOCK_ROWS):
        chunk = rows.slice(start, BLOCK_ROWS)
        if chunk.num_rows == 0:
            break
        blk = BlockNode(cat.new_id(), seg, MemBlock())
        loc = f"data/{t.id}/{blk.id}-{snapshot:020d}.parquet"
        store.put(loc, to_parquet(_block_object(chunk, blk.id, t, snapshot)))
        plans.append(
            (blk, loc, chunk.column(pk_name).to_pylist(), chunk.column(COMMIT_TS).to_pylist())
        )
    old_ids = {b.id for b in old_blocks}
    keys_all = rows.column(pk_name).to_pylist()

    def check() -> TnError | None:
        for b in old_blocks:
            if b.delete_ts != MAX_TS:
                return ConflictError("write_conflict", f"block {b.id} was already replaced")
        found = t.mem.lookup_many(keys_all)
        for k in keys_all:
            e = found.get(k)
            if e is None or e[2] > snapshot or e[0].id not in old_ids or not e[3]:
                return ConflictError("write_conflict", f"key {k!r} was written during compaction")
        if t.delete_ts != MAX_TS:
            return ConflictError("ddl_conflict", "table dropped during compaction")
        for gone in drop_segments:
            if any(b.delete_ts == MAX_TS and b.id not in old_ids for b in gone.blocks):
                return ConflictError("write_conflict", f"segment {gone.id} got a new block")
        return None

    def build(cts: int) -> list[Command]:
        out: list[Command] = []
        db_id = t.db.id
        if new_segment:
            seg.create_ts = cts
            t.mem.add_segment(seg)
            cat.register(seg)
            out.append(
                UpdateCatalog(
                    CatalogKind.SEGMENT, Dest(db_id, t.id, seg.id), EntryNode(cts), reason
                )
            )
        idx = t.mem.index
        for blk, loc, keys, row_cts in plans:
            blk.meta_loc = loc
            blk.create_ts = cts
            _new_block_mem(blk, loc, keys, row_cts, pk)
            t.mem.add_block(blk)
            cat.register(blk)
            t.mem.by_id[blk.id] = blk
            with t.mem.index_lock:
                idx.set_many(keys, blk.id, np.arange(len(keys)), cts, True)
            out.append(
                UpdateCatalog(
                    CatalogKind.BLOCK,
                    Dest(db_id, t.id, seg.id, blk.id),
                    EntryNode(cts, meta_loc=loc),
                    reason,
                )
            )
        for b in old_blocks:
            b.delete_ts = cts
            out.append(
                UpdateCatalog(
                    CatalogKind.BLOCK,
                    Dest(db_id, t.id, b.segment.id, b.id),
                    EntryNode(b.create_ts, cts, meta_loc=b.meta_loc, delta_loc=b.delta_loc),
                    reason,
                )
            )
        for gone in drop_segments:
            gone.delete_ts = cts
            out.append(
                UpdateCatalog(
                    CatalogKind.SEGMENT,
                    Dest(db_id, t.id, gone.id),
                    EntryNode(gone.create_ts, cts),
                    reason,
                )
            )
        return out

    txn = engine.begin()
    txn.system_op(build, check)
    result: int = txn.commit().result()
    _publish(publish, t, [p[0] for p in plans] + old_blocks)
    return result


def compact_block(
    engine: Any,
    store: ObjectStore,
    database: str,
    table: str,
    block_id: int,
    publish: Publish | None = None,
) -> int:
    """Sort one flushed, complete block by primary key into a new block; returns the
    compaction's commit ts. Raises ValidationError if the block cannot be compacted
    (not flushed/complete yet: checkpoint first) and ConflictError on a concurrent write."""
    t, schema = committed_table(engine, database, table)
    blk = engine.catalog.nodes.get(block_id)
    if not isinstance(blk, BlockNode) or blk.segment.table is not t or not compactable(blk):
        raise ValidationError("bad_request", f"block {block_id} is not a flushed, complete block")
    s = engine.heartbeat().result()
    rows = _live_rows(engine, blk, s, t)
    return _rewrite(
        engine, store, t, schema, [blk], rows, CatalogReason.COMPACT, s, False, (), publish
    )


def merge_segment(
    engine: Any,
    store: ObjectStore,
    database: str,
    table: str,
    segment_id: int,
    publish: Publish | None = None,
) -> int:
    """Merge the flushed, complete blocks of a segment into sorted blocks of a new
    segment; returns the merge's commit ts."""
    t, schema = committed_table(engine, database, table)
    seg = engine.catalog.nodes.get(segment_id)
    if not isinstance(seg, SegmentNode) or seg.table is not t or seg.delete_ts != MAX_TS:
        raise ValidationError(
            "bad_request", f"segment {segment_id} is not a live segment of {table}"
        )
    live = [b for b in seg.blocks if b.delete_ts == MAX_TS]
    blocks = [b for b in live if compactable(b)]
    if not blocks:
        raise ValidationError("bad_request", f"segment {segment_id} has no flushed, complete block")
    s = engine.heartbeat().result()
    rows = pa.concat_tables([_live_rows(engine, b, s, t) for b in blocks])
    # the old segment is deleted when every block of it was merged (else the open block
    # stays in it)
    return _rewrite(
        engine,
        store,
        t,
        schema,
        blocks,
        rows,
        CatalogReason.MERGE,
        s,
        True,
        [seg] if len(blocks) == len(live) else [],
        publish,
    )


def merge_blocks(
    engine: Any,
    store: ObjectStore,
    database: str,
    table: str,
    block_ids: Sequence[int],
    publish: Publish | None = None,
) -> int:
    """Merge flushed, complete blocks of one table (from any of its segments) into
    sorted blocks of a new segment; each segment left without a live block is deleted
    with them. Returns the merge's commit ts. Raises ValidationError when a block is
    not a compactable block of the table, ConflictError on a concurrent write."""
    t, schema = committed_table(engine, database, table)
    blocks: list[BlockNode] = []
    for block_id in sorted(set(block_ids)):
        blk = engine.catalog.nodes.get(block_id)
        if not isinstance(blk, BlockNode) or blk.segment.table is not t or not compactable(blk):
            raise ValidationError(
                "bad_request", f"block {block_id} is not a flushed, complete block of {table}"
            )
        blocks.append(blk)
    if len(blocks) < 2:
        raise ValidationError("bad_request", "a merge takes at least two blocks")
    ids = {b.id for b in blocks}
    segments = {b.segment.id: b.segment for b in blocks}
    emptied = [
        seg
        for seg in segments.values()
        if all(b.id in ids for b in seg.blocks if b.delete_ts == MAX_TS)
    ]
    s = engine.heartbeat().result()
    rows = pa.concat_tables([_live_rows(engine, b, s, t) for b in blocks])
    return _rewrite(
        engine, store, t, schema, blocks, rows, CatalogReason.MERGE, s, True, emptied, publish
    )


@dataclass
class ObjectPlan:
    """A large transaction's object, validated and laid out as block objects (written),
    waiting for its commit (`add_objects`)."""

    table: TableNode
    segment: SegmentNode
    blocks: list[tuple[BlockNode, str, list[Any]]]  # (block, its object key, its keys)
    pk: int  # the primary key's column id

    @property
    def keys(self) -> list[Any]:
        return [k for _, _, bkeys in self.blocks for k in bkeys]


def prepare_object(
    engine: Any, store: ObjectStore, t: TableNode, schema: TableSchema, key: str, start: int
) -> ObjectPlan:
    """Steps 1-3 of a large transaction's object (nothing is committed yet):
    1. read the Parquet object `key` and check it against `schema` (columns by name,
       types, nulls, keys unique within it and not live in the table at `start`);
    2. sort it by primary key and cut it into blocks of at most BLOCK_ROWS rows;
    3. write each block's object (`__row_id`, `__commit_ts` 0: the commit ts is the
       block's create ts, unknown until the commit)."""
    if not store.exists(key):
        raise LargeTxnError("missing_object", f"object {key!r} does not exist")
    try:
        data = from_parquet(store.get(key))
    except Exception as e:
        raise LargeTxnError("bad_object", f"object {key!r} is not a Parquet file: {e}") from e
    if data.num_rows > MAX_OBJECT_ROWS:
        raise LargeTxnError(
            "oversized", f"object {key!r} has {data.num_rows} rows; at most {MAX_OBJECT_ROWS}"
        )
    names = [c.name for c in schema.columns]
    extra = set(data.column_names) - set(names)
    if extra:
        raise LargeTxnError("schema_mismatch", f"columns not in {t.name}: {sorted(extra)}")
    cols: dict[str, pa.ChunkedArray | pa.Array] = {}
    for c in schema.columns:
        typ = ARROW_TYPES[c.type]
        if c.name not in data.column_names:
            if not c.nullable:
                raise LargeTxnError("schema_mismatch", f"column {c.name!r} is missing")
            cols[c.name] = pa.nulls(data.num_rows, typ)
            continue
        col = data.column(c.name)
        if col.type != typ:
            try:
                col = col.cast(typ)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise LargeTxnError(
                    "schema_mismatch", f"column {c.name!r} is {col.type}, not {typ}"
                ) from e
        if not c.nullable and col.null_count:
            raise LargeTxnError("schema_mismatch", f"column {c.name!r} has nulls")
        cols[c.name] = col
    del data
    cols[COMMIT_TS] = pa.array(np.zeros(len(next(iter(cols.values()))), dtype=np.int64))
    pk_name = schema.primary_key
    rows = pa.table(cols).sort_by([(pk_name, "ascending")])
    del cols
    if rows.column(pk_name).null_count:
        raise LargeTxnError("schema_mismatch", f"primary key {pk_name!r} has nulls")
    if pc.count_distinct(rows.column(pk_name)).as_py() != rows.num_rows:
        raise LargeTxnError("duplicate_key", f"duplicate primary keys in object {key!r}")
    cat = engine.catalog
    seg = SegmentNode(cat.new_id(), t)
    plan = ObjectPlan(t, seg, [], schema.column(pk_name).column_id)
    for s0 in range(0, rows.num_rows, BLOCK_ROWS):
        chunk = rows.slice(s0, BLOCK_ROWS)
        bkeys = chunk.column(pk_name).to_pylist()
        found = t.mem.lookup_many(bkeys)
        for k in bkeys:
            hit = found.get(k)
            if hit is not None and hit[3] and hit[2] <= start:
                raise LargeTxnError("duplicate_key", f"duplicate primary key {k!r}")
        blk = BlockNode(cat.new_id(), seg, MemBlock())
        loc = f"data/{t.id}/{blk.id}{LARGE_TXN_SUFFIX}"
        store.put(loc, to_parquet(_block_object(chunk, blk.id, t, start)))
        plan.blocks.append((blk, loc, bkeys))
    return plan


def add_objects(engine: Any, txn: Any, plans: Sequence[ObjectPlan], start: int) -> None:
    """Step 4: the plans become part of the open engine transaction `txn` (one system
    op): at its commit, under the pipeline lock, the keys are checked for writes after
    `start` (a conflict aborts the whole transaction), then the blocks are created at
    the commit ts and logged as UpdateCatalog commands (reason LARGE_TXN) in the same
    WAL entry as the transaction's other commands: all of it commits, or none."""
    if not plans:
        return
    tables = {id(p.table): p.table for p in plans}
    seen: set[tuple[int, Any]] = set()
    for p in plans:
        for k in p.keys:
            if (p.table.id, k) in seen:
                raise LargeTxnError(
                    "duplicate_key", f"duplicate primary key {k!r} across the objects"
                )
            seen.add((p.table.id, k))
    del seen

    def check() -> TnError | None:
        for t in tables.values():
            if t.delete_ts != MAX_TS or t.ddl_ts > start:
                return ConflictError("ddl_conflict", f"table {t.name} was dropped or altered")
        for p in plans:
            keys = p.keys
            found = p.table.mem.lookup_many(keys)
            for k in keys:
                e = found.get(k)
                if e is not None and (e[2] > start or e[3]):
                    return ConflictError("write_conflict", f"key {k!r} was written concurrently")
        return None

    def build(cts: int) -> list[Command]:
        out: list[Command] = []
        for p in plans:
            out.extend(_attach_blocks(engine.catalog, p, cts))
        return out

    txn.system_op(build, check)


def _attach_blocks(cat: Any, p: ObjectPlan, cts: int) -> list[Command]:
    """One plan's blocks created at `cts` (catalog, memtable, key index) and their
    WAL commands."""
    t, seg = p.table, p.segment
    seg.create_ts = cts
    t.mem.add_segment(seg)
    cat.register(seg)
    out: list[Command] = [
        UpdateCatalog(
            CatalogKind.SEGMENT,
            Dest(t.db.id, t.id, seg.id),
            EntryNode(cts),
            CatalogReason.LARGE_TXN,
        )
    ]
    idx = t.mem.index
    for blk, loc, bkeys in p.blocks:
        blk.meta_loc = loc
        blk.create_ts = cts
        _new_block_mem(blk, loc, bkeys, [cts] * len(bkeys), p.pk, override=cts)
        t.mem.add_block(blk)
        cat.register(blk)
        t.mem.by_id[blk.id] = blk
        with t.mem.index_lock:
            idx.set_many(bkeys, blk.id, np.arange(len(bkeys)), cts, True)
        out.append(
            UpdateCatalog(
                CatalogKind.BLOCK,
                Dest(t.db.id, t.id, seg.id, blk.id),
                EntryNode(cts, meta_loc=loc),
                CatalogReason.LARGE_TXN,
            )
        )
    return out


def attach_object(
    engine: Any,
    store: ObjectStore,
    database: str,
    table: str,
    key: str,
    publish: Publish | None = None,
) -> int:
    """Commit a large transaction of one object: the rows of the Parquet object `key`
    (the table's columns by name) are added to the table; only metadata goes through
    the WAL. Returns the commit ts. Raises LargeTxnError (missing object, schema
    mismatch, duplicate or null keys) or ConflictError (a key written concurrently).
    The service commits requests' objects with `prepare_object` + `add_objects`."""
    t, schema = committed_table(engine, database, table)
    start = engine.visible_ts
    plan = prepare_object(engine, store, t, schema, key, start)
    txn = engine.begin()
    add_objects(engine, txn, [plan], start)
    result: int = txn.commit().result()
    _publish(publish, t, [b[0] for b in plan.blocks])
    return result


def apply_object_block(blk: BlockNode, cmd: UpdateCatalog, cts: int, store: ObjectStore) -> None:
    """Replay of a block created in object storage (`Catalog.block_loader`): load its
    commit ts and key column; the key index points at it (it replaced the old rows)."""
    t = blk.segment.table
    schema = t.schemas[-1][1]
    pk_name = schema.primary_key
    pk = schema.column(pk_name).column_id
    data = from_parquet(store.get(blk.meta_loc))
    ids = {cid: name for name, cid in column_ids(data).items()}
    keys = data.column(ids[pk]).to_pylist() if pk in ids else []
    large = cmd.reason == CatalogReason.LARGE_TXN
    row_cts = [cts] * len(keys) if large else data.column(COMMIT_TS).to_pylist()
    _new_block_mem(blk, blk.meta_loc, keys, row_cts, pk, override=cts if large else 0)
    idx = t.mem.index
    t.mem.by_id[blk.id] = blk
    with t.mem.index_lock:
        idx.set_many(keys, blk.id, np.arange(len(keys)), cts, True)


__all__ = [
    "MAX_OBJECT_ROWS",
    "ObjectPlan",
    "add_objects",
    "aligned_columns",
    "committed_table",
    "apply_object_block",
    "attach_object",
    "compact_block",
    "compactable",
    "merge_blocks",
    "merge_segment",
    "prepare_object",
]
