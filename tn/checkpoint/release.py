"""Handing the memory a checkpoint freed back to the OS.

Why: a checkpoint drops the rows of every block it flushed (a whole interval's
working set) at once, but the allocators keep what was freed: glibc keeps free pages
inside its heaps and arenas until `malloc_trim`, and pyarrow's pool (mimalloc by
default) keeps freed segments until `release_unused`. Without this the TN's RSS stays
at the largest working set it ever had (docs/memory.md, "RSS and the allocators").
Python's own small-object allocator returns only 1 MiB arenas that are entirely free:
a TN process started with `PYTHONMALLOC=malloc` puts those objects in glibc's heap too,
whose free pages this trim returns wherever they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_libc: ctypes.CDLL | None = None
_looked = False


def _malloc_trim() -> bool:
    """glibc's malloc_trim(0) (every arena, free pages anywhere in the heaps); False where
    there is no glibc."""
    global _libc, _looked
    if not _looked:
        _looked = True
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name) if name else None
        except OSError:
            lib = None
        _libc = lib if lib is not None and hasattr(lib, "malloc_trim") else None
    if _libc is None:
        return False
    _libc.malloc_trim(0)
    return True


def release_free_memory() -> bool:
    """Return freed memory to the OS (glibc heaps, then pyarrow's pool); True when glibc's
    heaps were trimmed."""
    trimmed = _malloc_trim()
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except (ImportError, AttributeError):  # an older pyarrow: nothing to release
        pass
    return trimmed
