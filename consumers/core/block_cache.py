"""The Python CN's cache of block objects read from object storage (seed 001, "清理内存").

After a checkpoint a CN drops the in-memory rows of a flushed block (`TableState.
apply_block_meta`) and reads them from the block's object when a read needs them. The
objects read are kept here, least recently used first out, up to `max_bytes` (Arrow
bytes), so that the rows a CN holds stay bounded however long its history grows: the
in-memory rows are those not yet flushed, the rest is this cache. A read of an evicted
object fetches it again.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq

DEFAULT_MAX_BYTES = 64 << 20


class BlockCache:
    def __init__(self, load: Callable[[str], bytes], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._load = load
        self.max_bytes = max_bytes
        self._tables: OrderedDict[str, pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.reads = 0  # objects fetched from the store (a miss)

    def read(self, key: str) -> pa.Table:
        """The object `key` as an Arrow table (from the cache, else from the store)."""
        with self._lock:
            hit = self._tables.get(key)
            if hit is not None:
                self._tables.move_to_end(key)
                return hit
        table = pq.read_table(io.BytesIO(self._load(key)))
        with self._lock:
            self.reads += 1
            if key not in self._tables:
                self._tables[key] = table
                self._bytes += table.nbytes
            while self._bytes > self.max_bytes and len(self._tables) > 1:
                _, old = self._tables.popitem(last=False)
                self._bytes -= old.nbytes
        return table

    def rows(self) -> int:
        """Rows held (for the CN's memory gauge and tests)."""
        with self._lock:
            return sum(t.num_rows for t in self._tables.values())

    @property
    def nbytes(self) -> int:
        return self._bytes
