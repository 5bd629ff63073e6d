"""The catalog tree (database -> table -> segment -> block) with create@/delete@ MVCC."""

from tn.catalog.catalog import Catalog
from tn.catalog.nodes import (
    ABORTED_TS,
    MAX_TS,
    BlockNode,
    DatabaseNode,
    Node,
    SegmentNode,
    TableNode,
)

__all__ = [
    "ABORTED_TS",
    "MAX_TS",
    "BlockNode",
    "Catalog",
    "DatabaseNode",
    "Node",
    "SegmentNode",
    "TableNode",
]
