"""In-memory blocks (columnar, at most 8192 rows) and per-table data with the primary-key index."""

from tn.memtable.block import BLOCK_ROWS, MemBlock
from tn.memtable.table import SEGMENT_BLOCKS, TableData

__all__ = ["BLOCK_ROWS", "SEGMENT_BLOCKS", "MemBlock", "TableData"]
