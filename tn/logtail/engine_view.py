"""The collector's view of a running engine's catalog and memtable."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tn.catalog.nodes import BlockNode, DatabaseNode, TableNode
from tn.logtail.collector import CatalogView, TableInfo

if TYPE_CHECKING:
    from tn.engine import Engine


class EngineCatalogView(CatalogView):
    def __init__(self, engine: Engine) -> None:
        self._nodes = engine.catalog.nodes

    def table(self, table_id: int, ts: int) -> TableInfo:
        node = self._nodes[table_id]
        assert isinstance(node, TableNode), f"node {table_id} is not a table"
        schema = node.schema_at(ts)
        assert schema is not None, f"table {node.name} has no schema at {ts}"
        return TableInfo(node.db.name, node.name, schema)

    def database_name(self, db_id: int) -> str:
        return self._nodes[db_id].name

    def tables_of(self, db_id: int, ts: int) -> list[tuple[int, str]]:
        db = self._nodes[db_id]
        assert isinstance(db, DatabaseNode)
        return [
            (t.id, name)
            for name, versions in db.tables.items()
            for t in versions
            if t.alive(ts - 1)
        ]

    def primary_keys(self, block_id: int, rows: tuple[int, ...], table: TableInfo) -> list[object]:
        block = self._nodes[block_id]
        assert isinstance(block, BlockNode)
        col = block.mem.cols[table.schema.column(table.schema.primary_key).column_id]
        return [col[r] for r in rows]
