"""The Python CN's cache of object data read from object storage (seed 001, "清理内存").

After a checkpoint a CN drops the in-memory rows of a flushed block (`TableState.
apply_block_meta`) and reads them from the block's objects when a read needs them. Every
object read goes through here (`batches`):

1. a cached object's decoded record batches are returned as they are (a hit);
2. otherwise the object is fetched from the store and decoded `batch_rows` rows at a time
   (`pyarrow.parquet.ParquetFile.iter_batches`): the caller gets each batch as it is
   decoded, so a reader never holds more of an uncached object than one batch of it
   (plus its compressed bytes);
3. once the object has been read to its end, its batches are kept if they fit, least
   recently used objects evicted first so that the cache never holds more than
   `max_bytes` (the buffers of the Arrow batches it keeps); an object larger than
   `max_bytes` is never kept.

So the rows a CN holds stay bounded however long its history grows: the in-memory rows
are those not yet flushed, the rest is this cache (config `[cn] cache_bytes`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from infra.config import CnConfig

DEFAULT_MAX_BYTES = CnConfig.cache_bytes
DEFAULT_BATCH_ROWS = CnConfig.read_batch_rows


@dataclass(frozen=True)
class _Cached:
    batches: list[pa.RecordBatch]
    nbytes: int
    rows: int


def batch_bytes(batch: pa.RecordBatch) -> int:
    """What a batch costs in the cache: the size of every buffer it references."""
    return int(batch.get_total_buffer_size())


class BlockCache:
    def __init__(
        self,
        load: Callable[[str], bytes],
        max_bytes: int = DEFAULT_MAX_BYTES,
        batch_rows: int = DEFAULT_BATCH_ROWS,
    ) -> None:
        if max_bytes < 0 or batch_rows <= 0:
            raise ValueError(
                f"cn cache_bytes must be >= 0 and read_batch_rows > 0, got {max_bytes} and {batch_rows}"
            )
        self._load = load
        self.max_bytes = max_bytes
        self.batch_rows = batch_rows
        self._objects: OrderedDict[str, _Cached] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.reads = 0  # objects fetched from the store (a miss)
        self.hits = 0  # objects answered from the cache

    def batches(self, key: str) -> Iterator[pa.RecordBatch]:
        """The object `key`'s rows as record batches (steps 1-3 of the module docstring)."""
        with self._lock:
            hit = self._objects.get(key)
            if hit is not None:
                self._objects.move_to_end(key)
                self.hits += 1
        if hit is not None:
            yield from hit.batches
            return
        data = self._load(key)
        with self._lock:
            self.reads += 1
        parquet = pq.ParquetFile(pa.BufferReader(data))
        kept: list[pa.RecordBatch] | None = []
        size = rows = 0
        for batch in parquet.iter_batches(batch_size=self.batch_rows):
            if kept is not None:
                size += batch_bytes(batch)
                rows += batch.num_rows
                if size > self.max_bytes:
                    kept = None  # 3. larger than the whole cache: never kept
                else:
                    kept.append(batch)
            yield batch
        if kept is not None:
            self._keep(key, _Cached(kept, size, rows))

    def _keep(self, key: str, entry: _Cached) -> None:
        with self._lock:
            if key in self._objects:
                return  # another reader kept it meanwhile
            while self._objects and self._bytes + entry.nbytes > self.max_bytes:
                _, old = self._objects.popitem(last=False)
                self._bytes -= old.nbytes
            self._objects[key] = entry
            self._bytes += entry.nbytes

    def holds(self, key: str) -> bool:
        """Whether `key` is cached now (a reader may read those objects first)."""
        with self._lock:
            return key in self._objects

    def rows(self) -> int:
        """Rows held (for the CN's memory gauge and tests)."""
        with self._lock:
            return sum(e.rows for e in self._objects.values())

    def held_bytes(self) -> int:
        """The bytes held, counted again from the cached batches themselves (tests)."""
        with self._lock:
            return sum(batch_bytes(b) for e in self._objects.values() for b in e.batches)

    @property
    def nbytes(self) -> int:
        return self._bytes
