"""Replay: rebuild an engine's catalog and memtable from WAL entries (DESIGN "Data flow" 7).

The WAL is physical, so replay recreates every database, table, segment and
block with the id in its UpdateCatalog command, and puts every appended row at
the block offset its AppendInfo names. Rows of transactions that never
committed left gaps in blocks; replay fills them with placeholder rows whose
commit ts is ABORTED_TS (never visible), so offsets match.

`physical_state` dumps what must be equal before a crash and after replay.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from schemas.arrow_ipc import ipc_to_table
from schemas.codec import decode_entry
from schemas.wal import Append, CatalogKind, Delete, TableSchema, UpdateCatalog, WalEntry
from tn.catalog.catalog import Catalog
from tn.catalog.nodes import ABORTED_TS, BlockNode, DatabaseNode, SegmentNode, TableNode
from tn.logstore.driver import LogRecord
from tn.memtable.block import MemBlock
from tn.txn.rows import columns_of


class ReplayError(Exception):
    """A WAL entry does not fit the state rebuilt from the entries before it."""


def replay(catalog: Catalog, records: Iterable[LogRecord]) -> int:
    """Apply every record in order to `catalog`; returns the highest commit ts applied (0:
    none), which the engine's clock and visible ts then move past."""
    max_id = 0
    last_ts = 0
    for rec in records:
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
