"""Replay: rebuild an engine's catalog and memtable from WAL entries (DESIGN "Data flow" 7).

The WAL is physical, so replay recreates every database, table, segment and
block with the id in its UpdateCatalog command, and puts every appended row at
the block offset its AppendInfo names. Rows of transactions that never
committed left gaps in blocks; replay fills them with placeholder rows whose
commit ts is ABORTED_TS (never visible), so offsets match.

`physical_state` dumps what must be equal before a crash and after replay.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from schemas.arrow_ipc import ipc_to_table
from schemas.codec import decode_entry
from schemas.wal import Append, CatalogKind, Delete, TableSchema, UpdateCatalog, WalEntry
from schemas.wal_record import (
    A_BATCH,
    A_BLOCK,
    A_CTS,
    A_DB,
    A_DEST,
    A_LSN,
    A_ROW,
    A_ROWS,
    A_SEGMENT,
    A_TABLE,
    Group,
)
from tn.catalog.catalog import Catalog
from tn.catalog.nodes import ABORTED_TS, BlockNode, DatabaseNode, SegmentNode, TableNode
from tn.logstore.driver import LogRecord, RecordRun
from tn.memtable.block import MemBlock
from tn.txn.rows import columns_of


class ReplayError(Exception):
    """A WAL entry does not fit the state rebuilt from the entries before it."""


def replay(catalog: Catalog, records: Iterable[LogRecord | RecordRun]) -> int:
    """Apply every record in order to `catalog` (entries, or runs of a record's entries:
    `LogStore.runs`); returns the highest commit ts applied (0: none), which the engine's
    clock and visible ts then move past."""
    max_id = 0
    last_ts = 0
    for rec in records:
        if isinstance(rec, RecordRun):
            done = apply_group(catalog, rec.group.group(), rec.lo, rec.hi)
            max_id = max(max_id, done.max_id)
            last_ts = max(last_ts, done.last_ts)
            continue
        entry = decode_entry(rec.payload)
        max_id = max(max_id, apply_entry(catalog, entry))
        last_ts = max(last_ts, entry.txn.commit_ts)
    catalog.reserve_ids(max_id)
    return last_ts


def apply_entry(cat: Catalog, entry: WalEntry) -> int:
    """Apply one committed transaction; returns the highest node id it names."""
    cts = entry.txn.commit_ts
    max_id = 0
    # per table: its inserts and its deletes, as `index_commit` takes them
    changed: dict[TableNode, tuple[list[Any], list[Any]]] = {}
    for cmd in entry.commands:
        if isinstance(cmd, UpdateCatalog):
            d = cmd.dest
            max_id = max(max_id, d.db_id, d.table_id, d.segment_id, d.block_id)
            _apply_catalog(cat, cmd, cts)
        elif isinstance(cmd, Append):
            if not cmd.infos:
                continue
            t = _node(cat, cmd.infos[0].dest.table_id, TableNode)
            schema = t.schemas[-1][1]
            cols, keys = _columns(cmd.batch, schema)
            ins = changed.setdefault(t, ([], []))[0]
            for info in cmd.infos:
                blk = _node(cat, info.dest.block_id, BlockNode)
                # replay is the only writer: the rows take their commit ts at once
                t.mem.place(
                    blk, info.dest_offset, cols, info.src_offset, info.src_length, cts, ABORTED_TS
                )
                ins.append((keys, info.src_offset, blk, info.dest_offset, info.src_length))
        elif isinstance(cmd, Delete):
            t = _node(cat, cmd.dest.table_id, TableNode)
            blk = _node(cat, cmd.dest.block_id, BlockNode)
            schema = t.schemas[-1][1]
            pk_col = blk.mem.cols.get(schema.column(schema.primary_key).column_id, [])
            dl = changed.setdefault(t, ([], []))[1]
            for row in cmd.rows:
                if row >= len(blk.mem):
                    raise ReplayError(
                        f"delete of row {row} beyond block {blk.id} ({len(blk.mem)} rows)"
                    )
                blk.mem.dts[row] = cts
                dl.append((pk_col[row], blk, row))
    for t, (ins, dl) in changed.items():
        t.mem.index_commit(ins, dl, cts)
    return max_id


@dataclass
class Applied:
    """What `apply_group` applied: the highest node id named and commit ts, and per entry
    (in LSN order) its LSN, commit ts and the block ids of its memo."""

    max_id: int = 0
    last_ts: int = 0
    lsns: list[int] | None = None
    cts: list[int] | None = None
    memos: list[tuple[int, ...]] | None = None


def apply_group(cat: Catalog, group: Group, lo: int, hi: int) -> Applied:
    """Apply the entries lo..hi (LSNs) of a decoded WAL record, in LSN order.

    Why not `apply_entry` per entry: a record's one-block Append entries (version 3's
    ``appends`` columns) are applied as runs -- consecutive entries into the same block
    from the same batch -- each with ONE bulk place (`TableData.place_rows`, a commit ts
    per row) and ONE index update (`TableData.index_insert_rows`), so a run costs a few
    array operations, not a call chain per entry. Every other entry (DDL, deletes,
    updates, large transactions; all of a version 2 record's) is applied by `apply_entry`
    in its place in the LSN order, so a block it creates exists before rows land in it."""
    a = group.appends
    lsns = a[A_LSN] if a else []
    i0, i1 = bisect_left(lsns, lo), bisect_right(lsns, hi)
    out = Applied(lsns=[], cts=[], memos=[])
    assert out.lsns is not None and out.cts is not None and out.memos is not None
    at = i0
    for e in group.others:
        if not lo <= e.lsn <= hi:
            continue
        stop = bisect_left(lsns, e.lsn, at, i1)
        if stop > at:
            _apply_appends(cat, group, at, stop, out)
            at = stop
        out.max_id = max(out.max_id, apply_entry(cat, e))
        cts = e.txn.commit_ts
        out.last_ts = max(out.last_ts, cts)
        out.lsns.append(e.lsn)
        out.cts.append(cts)
        out.memos.append(tuple(d.block_id for d in e.txn.memo))
    if i1 > at:
        _apply_appends(cat, group, at, i1, out)
    return out


def _apply_appends(cat: Catalog, group: Group, i0: int, i1: int, out: Applied) -> None:
    """Appends i0..i1-1 of the group (in LSN order), run by run."""
    a = group.appends
    blocks, batches = a[A_BLOCK], a[A_BATCH]
    s = i0
    while s < i1:  # a run: consecutive entries with the same block and batch
        b, bt = blocks[s], batches[s]
        e = s + 1
        while e < i1 and blocks[e] == b and batches[e] == bt:
            e += 1
        _apply_run(cat, group, s, e)
        s = e
    cts = a[A_CTS][i0:i1]
    out.max_id = max(out.max_id, *(max(a[c][i0:i1]) for c in (A_DB, A_TABLE, A_SEGMENT, A_BLOCK)))
    out.last_ts = max(out.last_ts, max(cts))
    assert out.lsns is not None and out.cts is not None and out.memos is not None
    out.lsns.extend(a[A_LSN][i0:i1])
    out.cts.extend(cts)
    out.memos.extend([(b,) for b in blocks[i0:i1]])


def _apply_run(cat: Catalog, group: Group, s: int, e: int) -> None:
    """Appends s..e-1 of the group, one run (same block, same batch): one place, one index
    update."""
    a = group.appends
    t = _node(cat, a[A_TABLE][s], TableNode)
    blk = _node(cat, a[A_BLOCK][s], BlockNode)
    if blk.segment.table is not t or any(x != t.id for x in a[A_TABLE][s:e]):
        raise ReplayError(f"WAL appends into block {blk.id} name another table than its own")
    schema = t.schemas[-1][1]
    cols, keys = _columns(group.streams[a[A_BATCH][s]], schema)
    src, dest, cts = a[A_ROW][s:e], a[A_DEST][s:e], a[A_CTS][s:e]
    ns = a[A_ROWS][s:e]
    if max(ns) > 1:  # multi-row entries: one element per row
        src = [r + j for r, n in zip(src, ns, strict=True) for j in range(n)]
        dest = [r + j for r, n in zip(dest, ns, strict=True) for j in range(n)]
        cts = [c for c, n in zip(cts, ns, strict=True) for _ in range(n)]
    n = len(src)
    s0 = src[0]
    if src == list(range(s0, s0 + n)):  # the entries' rows follow each other in the batch
        values = {cid: v[s0 : s0 + n] for cid, v in cols.items()}
        run_keys = keys[s0 : s0 + n]
    else:
        values = {cid: [v[r] for r in src] for cid, v in cols.items()}
        run_keys = [keys[r] for r in src]
    t.mem.place_rows(blk, dest, values, cts, ABORTED_TS)
    t.mem.index_insert_rows(run_keys, blk, dest, cts)


# The last batch's columns (`_columns`): since WAL record format 2 the entries of a record
# share one batch, which is read and turned into Python lists once, not once per entry.
_last: tuple[bytes, TableSchema, dict[int, list[Any]], list[Any]] | None = None


def _columns(data: bytes, schema: TableSchema) -> tuple[dict[int, list[Any]], list[Any]]:
    """An Append batch's columns by column id, and its primary keys, for `schema`."""
    global _last
    last = _last
    if last is not None and last[0] is data and last[1] is schema:
        return last[2], last[3]
    batch = ipc_to_table(data, validate=False)
    cols = columns_of(schema, batch)
    keys = cols.get(schema.column(schema.primary_key).column_id)
    if keys is None:
        keys = batch.column(schema.primary_key).to_pylist()
    _last = (data, schema, cols, keys)
    return cols, keys


def _node(cat: Catalog, node_id: int, kind: type) -> Any:
    node = cat.nodes.get(node_id)
    if not isinstance(node, kind):
        raise ReplayError(f"WAL names {kind.__name__} {node_id}, which replay does not have")
    return node


def _apply_catalog(cat: Catalog, cmd: UpdateCatalog, cts: int) -> None:
    d, n = cmd.dest, cmd.node
    if cmd.kind == CatalogKind.DATABASE:
        db = cat.nodes.get(d.db_id)
        if db is None:
            db = cat.add_database(n.name, node_id=d.db_id)
            db.create_ts = n.create_ts
            cat.db_name_ts[db.name] = n.create_ts
        if n.delete_ts:
            db.delete_ts = n.delete_ts
            cat.db_name_ts[db.name] = n.delete_ts
    elif cmd.kind == CatalogKind.TABLE:
        t = cat.nodes.get(d.table_id)
        if t is None:
            parent = _node(cat, d.db_id, DatabaseNode)
            t = cat.add_table(parent, n.name, node_id=d.table_id)
            t.create_ts = n.create_ts
            assert n.schema is not None, "table creation without a schema"
            t.schemas.append((n.create_ts, n.schema))
            t.ddl_ts = n.create_ts
            parent.name_ts[t.name] = n.create_ts
            parent.child_ts = n.create_ts
        elif not n.delete_ts and n.schema is not None:  # alter table
            assert isinstance(t, TableNode)
            t.schemas.append((cts, n.schema))
            t.ddl_ts = cts
        if n.delete_ts:
            assert isinstance(t, TableNode)
            t.delete_ts = n.delete_ts
            t.ddl_ts = n.delete_ts
            t.db.name_ts[t.name] = n.delete_ts
            t.db.child_ts = n.delete_ts
    elif cmd.kind == CatalogKind.SEGMENT:
        seg = cat.nodes.get(d.segment_id)
        if seg is None:
            t = _node(cat, d.table_id, TableNode)
            seg = SegmentNode(d.segment_id, t)
            seg.create_ts = n.create_ts
            t.mem.add_segment(seg)
            cat.register(seg)
        if n.delete_ts:
            seg.delete_ts = n.delete_ts
    elif cmd.kind == CatalogKind.BLOCK:
        blk = cat.nodes.get(d.block_id)
        if blk is None:
            seg = _node(cat, d.segment_id, SegmentNode)
            blk = BlockNode(d.block_id, seg, MemBlock())
            blk.create_ts = n.create_ts
            seg.table.mem.add_block(blk)
            cat.register(blk)
            if n.meta_loc:
                # a block created with its rows in object storage (compact, merge, large
                # transaction): the checkpoint layer loads it
                blk.meta_loc = n.meta_loc
                blk.delta_loc = n.delta_loc
                if cat.block_loader is None:
                    raise ReplayError(f"block {blk.id} is in object storage but no loader is set")
                cat.block_loader(blk, cmd, cts)
        elif n.meta_loc or n.delta_loc:  # a checkpoint flush
            assert isinstance(blk, BlockNode)
            if n.meta_loc:
                blk.meta_loc = n.meta_loc
            if n.delta_loc:
                blk.delta_loc = n.delta_loc
        if n.delete_ts:
            blk.delete_ts = n.delete_ts


def physical_state(cat: Catalog) -> dict[str, Any]:
    """Everything replay must reproduce: committed catalog nodes (ids, parents, names,
    create@/delete@, schema versions) and, for every committed block, each committed row's
    offset, commit ts, delete ts and values by column id."""
    with cat.lock:
        nodes = list(cat.nodes.values())
    catalog = []
    blocks: dict[int, list[tuple[Any, ...]]] = {}
    for node in sorted(nodes, key=lambda x: x.id):
        if not node.committed:
            continue
        parent = 0
        extra: Any = None
        if isinstance(node, TableNode):
            parent = node.db.id
            extra = tuple(node.schemas)
        elif isinstance(node, SegmentNode):
            parent = node.table.id
        elif isinstance(node, BlockNode):
            parent = node.segment.id
            mem = node.mem
            rows = []
            for i in range(len(mem)):
                c = mem.cts[i]
                if c >= ABORTED_TS:
                    continue
                vals = tuple(
                    sorted(
                        (cid, col[i])
                        for cid, col in mem.cols.items()
                        if i < len(col) and col[i] is not None
                    )
                )
                rows.append((i, c, mem.dts[i], vals))
            blocks[node.id] = rows
        catalog.append(
            (node.id, node.kind.value, parent, node.name, node.create_ts, node.delete_ts, extra)
        )
    return {"catalog": catalog, "blocks": blocks}
