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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

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
from tn.memtable.table import TableData
from tn.txn.rows import columns_of


class ReplayError(Exception):
    """A WAL entry does not fit the state rebuilt from the entries before it."""


def replay(catalog: Catalog, records: Iterable[LogRecord | RecordRun]) -> int:
    """Apply every record in order to `catalog` (entries, or runs of a record's entries:
    `LogStore.runs`); returns the highest commit ts applied (0: none), which the engine's
    clock and visible ts then move past."""
    max_id = 0
    last_ts = 0
    for item in in_chunks(records):
        if isinstance(item, LogRecord):
            entry = decode_entry(item.payload)
            max_id = max(max_id, apply_entry(catalog, entry))
            last_ts = max(last_ts, entry.txn.commit_ts)
            continue
        done = apply_groups(catalog, item)
        max_id = max(max_id, done.max_id)
        last_ts = max(last_ts, done.last_ts)
    catalog.reserve_ids(max_id)
    return last_ts


CHUNK_RECORDS = 256  # records applied together (`in_chunks`)


def in_chunks(
    records: Iterable[LogRecord | RecordRun], size: int = CHUNK_RECORDS
) -> Iterator[LogRecord | list[tuple[Group, int, int]]]:
    """`records` with consecutive `RecordRun`s gathered `size` at a time, decoded, as
    `apply_groups` takes them (a run of rows into one block then spans records)."""
    chunk: list[tuple[Group, int, int]] = []
    for rec in records:
        if isinstance(rec, RecordRun):
            chunk.append((rec.group.group(), rec.lo, rec.hi))
            if len(chunk) >= size:
                yield chunk
                chunk = []
            continue
        if chunk:
            yield chunk
            chunk = []
        yield rec
    if chunk:
        yield chunk


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
    lsns: list[int] = field(default_factory=list)
    cts: list[int] = field(default_factory=list)
    memos: list[tuple[int, ...]] = field(default_factory=list)


def apply_group(cat: Catalog, group: Group, lo: int, hi: int) -> Applied:
    """Apply the entries lo..hi (LSNs) of a decoded WAL record (`apply_groups`)."""
    return apply_groups(cat, [(group, lo, hi)])


def apply_groups(cat: Catalog, runs: Sequence[tuple[Group, int, int]]) -> Applied:
    """Apply the entries lo..hi (LSNs) of each decoded WAL record, records and entries in
    LSN order.

    Why not `apply_entry` per entry: one-block Append entries (version 3's ``appends``
    columns) are gathered into runs -- consecutive entries into the same block, across
    records -- each placed with ONE `TableData.place_rows` (a commit ts per row) and
    indexed with ONE `TableData.index_insert_rows`, so a run costs a few list and array
    operations, not a call chain per entry (nor per record: consecutive records fill the
    same block). Every other entry (DDL, deletes, updates, large transactions; all of a
    version 2 record's) is applied by `apply_entry` in its place in the LSN order, after
    the run gathered so far is placed: it sees every row before it."""
    out = Applied()
    run: _Run | None = None
    for group, lo, hi in runs:
        a = group.appends
        lsns = a[A_LSN] if a else []
        i0, i1 = bisect_left(lsns, lo), bisect_right(lsns, hi)
        at = i0
        for e in group.others:
            if not lo <= e.lsn <= hi:
                continue
            stop = bisect_left(lsns, e.lsn, at, i1)
            if stop > at:
                run = _gather(cat, group, at, stop, out, run)
                at = stop
            if run is not None:
                run.place()
                run = None
            out.max_id = max(out.max_id, apply_entry(cat, e))
            cts = e.txn.commit_ts
            out.last_ts = max(out.last_ts, cts)
            out.lsns.append(e.lsn)
            out.cts.append(cts)
            out.memos.append(tuple(d.block_id for d in e.txn.memo))
        if i1 > at:
            run = _gather(cat, group, at, i1, out, run)
    if run is not None:
        run.place()
    for group, _, _ in runs:
        # every row is placed: the batches as decoding read them are let go (~1.7 kB a
        # record), the decoded record itself stays with whoever holds it (the driver)
        group.tables = [None] * len(group.streams)
    return out


class _Run:
    """Rows gathered for one block (`apply_groups`): where each lands, its commit ts, and
    the Arrow batches (or slices of them) holding its values, in row order.

    Why batches, not Python lists: turning a record's few rows into lists cost a
    `to_pylist` per column per record; the batches of a run (consecutive records filling
    one block) are concatenated when it is placed, and turned into lists once."""

    __slots__ = ("table", "block", "dest", "cts", "pieces")

    def __init__(self, table: TableNode, block: BlockNode) -> None:
        self.table = table
        self.block = block
        self.dest: list[int] = []
        self.cts: list[int] = []
        self.pieces: list[pa.Table] = []

    def place(self) -> None:
        """Place and index the rows gathered (then the run is empty)."""
        if not self.dest:
            return
        pieces = self.pieces
        data = pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces).combine_chunks()
        cols, keys = _table_columns(data, self.table.schemas[-1][1])
        mem: TableData = self.table.mem  # type: ignore[assignment]  # the catalog names a Protocol
        mem.place_rows(self.block, self.dest, cols, self.cts, ABORTED_TS)
        mem.index_insert_rows(keys, self.block, self.dest, self.cts)
        self.dest, self.cts, self.pieces = [], [], []


def _gather(
    cat: Catalog, group: Group, i0: int, i1: int, out: Applied, run: _Run | None
) -> _Run | None:
    """Add appends i0..i1-1 of the group to the runs (placing each run its block ends)."""
    a = group.appends
    blocks, tables, batches = a[A_BLOCK], a[A_TABLE], a[A_BATCH]
    s = i0
    while s < i1:  # a part: consecutive entries with the same block and batch
        b, bt = blocks[s], batches[s]
        e = s + 1
        while e < i1 and blocks[e] == b and batches[e] == bt:
            e += 1
        if run is None or run.block.id != b or any(x != run.table.id for x in tables[s:e]):
            if run is not None:
                run.place()
            run = _start(cat, tables[s], b)
            if any(x != run.table.id for x in tables[s:e]):
                raise ReplayError(f"WAL appends into block {b} name several tables")
        _add(run, group, s, e)
        out.memos += [(b,)] * (e - s)  # one memo tuple per part, shared by its entries
        s = e
    cts = a[A_CTS][i0:i1]
    out.max_id = max(out.max_id, *(max(a[c][i0:i1]) for c in (A_DB, A_TABLE, A_SEGMENT, A_BLOCK)))
    out.last_ts = max(out.last_ts, max(cts))
    out.lsns.extend(a[A_LSN][i0:i1])
    out.cts.extend(cts)
    return run


def _start(cat: Catalog, table_id: int, block_id: int) -> _Run:
    t = _node(cat, table_id, TableNode)
    blk = _node(cat, block_id, BlockNode)
    if blk.segment.table is not t:
        raise ReplayError(f"WAL appends into block {blk.id} name another table than its own")
    return _Run(t, blk)


def _add(run: _Run, group: Group, s: int, e: int) -> None:
    """Appends s..e-1 of the group (same block, same batch) join `run`."""
    a = group.appends
    b = a[A_BATCH][s]
    batch = group.tables[b]
    if batch is None:
        batch = ipc_to_table(group.streams[b], validate=False)
    src, dest, cts = a[A_ROW][s:e], a[A_DEST][s:e], a[A_CTS][s:e]
    ns = a[A_ROWS][s:e]
    if max(ns) > 1:  # multi-row entries: one element per row
        src = [r + j for r, n in zip(src, ns, strict=True) for j in range(n)]
        dest = [r + j for r, n in zip(dest, ns, strict=True) for j in range(n)]
        cts = [c for c, n in zip(cts, ns, strict=True) for _ in range(n)]
    n = len(src)
    s0 = src[0]
    if src != list(range(s0, s0 + n)):  # the entries' rows are not in batch order
        piece = batch.take(src)
    elif n == batch.num_rows:  # the whole batch (the common case: a record's rows)
        piece = batch
    else:
        piece = batch.slice(s0, n)
    if run.pieces and not piece.schema.equals(run.pieces[0].schema):
        run.place()  # another set of columns than the rows gathered: those go first
    run.pieces.append(piece)
    run.dest += dest
    run.cts += cts


# The last batch's columns (`_columns`): since WAL record format 2 the entries of a record
# share one batch, which is read and turned into Python lists once, not once per entry.
_last: tuple[bytes, TableSchema, dict[int, list[Any]], list[Any]] | None = None


def _columns(data: bytes, schema: TableSchema) -> tuple[dict[int, list[Any]], list[Any]]:
    """An Append batch's columns by column id, and its primary keys, for `schema`."""
    global _last
    last = _last
    if last is not None and last[0] is data and last[1] is schema:
        return last[2], last[3]
    cols, keys = _table_columns(ipc_to_table(data, validate=False), schema)
    _last = (data, schema, cols, keys)
    return cols, keys


def _table_columns(batch: pa.Table, schema: TableSchema) -> tuple[dict[int, list[Any]], list[Any]]:
    """A batch's columns as lists by column id, and its primary keys, for `schema`."""
    cols = columns_of(schema, batch)
    keys = cols.get(schema.column(schema.primary_key).column_id)
    if keys is None:
        keys = batch.column(schema.primary_key).to_pylist()
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
