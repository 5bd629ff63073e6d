"""A flushed block's rows in memory: views over its objects, and the table's key filters.

Once a checkpoint has dumped a block whose object holds every row it will ever have,
the block keeps no per-row Python object: its commit ts (`FlushedTs`), delete ts
(`FlushedDts`: the delta object plus the deletes committed since it was written) and
key column (`DroppedCols`) are read from the objects on demand through an `ObjectRows`
reader (tn.checkpoint.dump.BlockReader, an LRU cache). They index and slice like the
lists of a block in memory (slices are numpy arrays), so readers of `MemBlock` work on
both.

`FlushedKeys` holds the primary-key filters (tn.memtable.pk_filter) of a table's
flushed blocks, stacked bit-sliced: `bits[p]` has one bit per block, set when the
block's filter has bit p. A key's candidate blocks are the AND of its HASHES rows:
O(blocks / 8) bytes per key, whatever the history.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol, overload

import numpy as np

from tn.catalog.nodes import ABORTED_TS, MAX_TS, BlockNode
from tn.memtable.columns import FixedColumn, VarColumn
from tn.memtable.pk_filter import KeyFilter, key_hashes, positions

_NO_BITS = np.zeros(0, dtype=bool)


class KeyRowsLike(Protocol):
    """key -> rows of one flushed block (tn.checkpoint.dump.KeyRows)."""

    def find(self, keys: Sequence[Any]) -> list[tuple[Any, tuple[int, ...]]]: ...


class ObjectRows(Protocol):
    """Reads flushed blocks' per-row data from their objects (cached)."""

    bits_per_key: int

    def row_ts(self, loc: str, n: int) -> np.ndarray: ...  # ABORTED_TS where no row

    def delete_ts(self, loc: str, n: int) -> np.ndarray: ...  # MAX_TS where not deleted

    def keys(self, loc: str, pk: int, n: int) -> Sequence[Any]: ...

    def key_rows(self, loc: str, pk: int, n: int) -> KeyRowsLike: ...

    def key_filter(self, blk: BlockNode, pk: int, m: int) -> KeyFilter: ...


def loc_ts(loc: str) -> int:
    """The t1 an object was written at (from its key `.../<block>-<ts>...`); 0 for ""."""
    if not loc:
        return 0
    name = loc.rsplit("/", 1)[-1]
    try:
        return int(name.split("-", 1)[1].split(".", 1)[0])
    except (IndexError, ValueError):
        return 0


class DroppedCols(dict[int, list[Any]]):
    """`MemBlock.cols` of a flushed block: no column in memory; the primary-key column
    (deletes, replay and the logtail need a row's key) reads from the object. `loc` is
    the object readers load the other columns from."""

    __slots__ = ("loc", "pk", "reader", "n")

    def __init__(
        self,
        loc: str,
        pk: dict[int, list[Any]] | None = None,
        *,
        pk_cid: int = -1,
        reader: ObjectRows | None = None,
        n: int = 0,
    ) -> None:
        super().__init__(pk or {})
        self.loc = loc
        self.pk = pk_cid
        self.reader = reader
        self.n = n

    def get(self, cid: int, default: Any = None) -> Any:
        if cid == self.pk and self.reader is not None and not dict.__contains__(self, cid):
            return self.reader.keys(self.loc, cid, self.n)
        return dict.get(self, cid, default)

    def __getitem__(self, cid: int) -> list[Any]:
        got = self.get(cid)
        if got is None:
            raise KeyError(cid)
        if isinstance(got, (FixedColumn, VarColumn)):  # kept without an object reader
            return got[: self.n]
        return got.tolist() if hasattr(got, "tolist") else list(got)


class FlushedTs:
    """Commit ts of a flushed block's rows, from its object (`override`: every row's
    commit ts is that, for objects written before their commit ts was known)."""

    __slots__ = ("reader", "loc", "n", "override", "_present")

    def __init__(
        self, reader: ObjectRows, loc: str, n: int, override: int = 0, present: int = -1
    ) -> None:
        self.reader = reader
        self.loc = loc
        self.n = n
        self.override = override
        self._present = present

    def __len__(self) -> int:
        return self.n

    def array(self) -> np.ndarray:
        a = self.reader.row_ts(self.loc, self.n)
        if self.override:
            a = np.where(a < ABORTED_TS, np.int64(self.override), a)
        return a

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> np.ndarray: ...

    def __getitem__(self, i: int | slice) -> int | np.ndarray:
        a = self.array()
        if isinstance(i, slice):
            return a[i]
        return int(a[i])

    def __setitem__(self, i: Any, v: Any) -> None:
        raise TypeError("a flushed block's rows are final: its commit ts cannot change")

    def present(self) -> int:
        """Rows the object holds (cached after the first count)."""
        if self._present < 0:
            self._present = int((self.array() < ABORTED_TS).sum())
        return self._present


# One lock for every flushed block's late deletes (they are rare, and a lock per block
# is one more small object that outlives the rows around it: docs/memory.md)
_DTS_LOCK = threading.Lock()


class FlushedDts:
    """Delete ts of a flushed block's rows: the delta object `loc` (deletes up to its
    ts) plus `recent`, the deletes committed since (row -> ts; moved into the next delta
    object by the checkpoint: `rebase`)."""

    __slots__ = ("reader", "n", "_state", "_lock", "_base_count")

    def __init__(self, reader: ObjectRows, loc: str, n: int, recent: dict[int, int]) -> None:
        self.reader = reader
        self.n = n
        self._state: tuple[str, dict[int, int]] = (loc, dict(recent))
        self._lock = _DTS_LOCK
        self._base_count = -1

    @property
    def loc(self) -> str:
        return self._state[0]

    @property
    def recent(self) -> dict[int, int]:
        return self._state[1]

    def __len__(self) -> int:
        return self.n

    def array(self) -> np.ndarray:
        loc, recent = self._state
        if loc:
            a = self.reader.delete_ts(loc, self.n).copy()
        else:
            a = np.full(self.n, MAX_TS, dtype=np.int64)
        if recent:
            items = list(recent.items())
            a[np.fromiter((r for r, _ in items), np.int64, len(items))] = np.fromiter(
                (d for _, d in items), np.int64, len(items)
            )
        return a

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> np.ndarray: ...

    def __getitem__(self, i: int | slice) -> int | np.ndarray:
        if isinstance(i, slice):
            return self.array()[i]
        loc, recent = self._state
        d = recent.get(i)
        if d is not None:
            return d
        if not loc:
            if not -self.n <= i < self.n:
                raise IndexError(i)
            return MAX_TS
        return int(self.reader.delete_ts(loc, self.n)[i])

    def __setitem__(self, row: int, ts: int) -> None:
        if not 0 <= row < self.n:
            raise IndexError(row)
        with self._lock:
            self._state[1][row] = ts

    def rebase(self, loc: str, upto: int) -> None:
        """The delta object `loc` now holds every delete with ts <= upto."""
        with self._lock:
            _, recent = self._state
            self._state = (loc, {r: d for r, d in recent.items() if d > upto})
            self._base_count = -1

    def all_deleted_by(self, upto: int, cts: FlushedTs) -> bool:
        """Whether every row of the block (the rows its object holds: `cts`) was deleted
        at or before upto. The counts first (cached): the rows' ts are read only for a
        block whose rows are all deleted."""
        loc, recent = self._state
        if not loc and not recent:
            return False
        if self._base_count < 0:
            self._base_count = int((self.reader.delete_ts(loc, self.n) < MAX_TS).sum()) if loc else 0
        rows = cts.present()
        if not rows or self._base_count + len(recent) < rows:
            return False
        return bool(np.all(self.array()[cts.array() < ABORTED_TS] <= upto))

    def deleted(self, ts: int) -> int:
        """Rows deleted at or before ts, for ts at or after the delta object's ts."""
        loc, recent = self._state
        if ts < loc_ts(loc):
            return int((self.array() <= ts).sum())
        if self._base_count < 0:
            self._base_count = int((self.reader.delete_ts(loc, self.n) < MAX_TS).sum()) if loc else 0
        return self._base_count + sum(1 for d in list(recent.values()) if d <= ts)


_I64_MIN = np.iinfo(np.int64).min
_I64_MAX = np.iinfo(np.int64).max


def _is_i64(v: Any) -> bool:
    return type(v) is int and _I64_MIN <= v <= _I64_MAX


_INT_ZONE = KeyFilter(0, None, None, _NO_BITS)  # a slot whose zone map is in lo / hi


def _int_zone_may_hold(key: Any, lo: np.int64, hi: np.int64) -> bool:
    """An int64 zone map's answer for a key that is not an int64 ("maybe" where the key
    does not compare with ints)."""
    try:
        return bool(int(lo) <= key <= int(hi))
    except TypeError:
        return True


_FEW = 16  # up to this many int keys are checked against the zone in Python


def _all_rows_deleted(blk: BlockNode, upto: int) -> bool:
    """Whether every row of flushed block `blk` was deleted at or before `upto` (False for
    a block whose timestamps are not yet the flushed kind)."""
    cts, dts = getattr(blk.mem, "cts", None), getattr(blk.mem, "dts", None)
    return isinstance(cts, FlushedTs) and isinstance(dts, FlushedDts) and dts.all_deleted_by(upto, cts)


def _int_keys(keys: Sequence[Any] | np.ndarray) -> np.ndarray | None:
    """The keys as int64, when every one is a plain int that fits; else None."""
    if isinstance(keys, np.ndarray) and keys.dtype == np.int64:
        return keys
    if not all(type(k) is int for k in keys):
        return None
    try:
        return np.array(keys, dtype=np.int64)
    except OverflowError:
        return None


class FlushedKeys:
    """The key filters of a table's flushed blocks, stacked bit-sliced (module doc)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.m = 0
        self.slots: list[BlockNode | None] = []
        self.filters: list[KeyFilter | None] = []
        self.slot_of: dict[int, int] = {}
        self.free: list[int] = []
        self.bits = np.zeros((0, 0), dtype=np.uint8)
        # the zone maps of integer keys by slot, for a vectorized first check (a slot
        # without one: the widest bounds; its exact check is `KeyFilter.may_hold`)
        self.lo = np.zeros(0, dtype=np.int64)
        self.hi = np.zeros(0, dtype=np.int64)
        self.pending: dict[int, BlockNode] = {}  # registered, filter not loaded yet
        self.loads = 0  # filters loaded (or rebuilt) lazily
        # the smallest lo and largest hi over the slots (Python ints; None: to compute
        # again after a slot changed): an int key outside it is in no flushed block
        self._zone: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.slot_of) + len(self.pending)

    def register(self, blk: BlockNode, flt: KeyFilter | None = None) -> None:
        """A flushed block: its filter now (`flt`), or loaded at the first lookup."""
        with self.lock:
            if blk.id in self.slot_of:
                return
            if flt is None or (self.m and flt.m != self.m):
                self.pending[blk.id] = blk
            else:
                self._add(blk, flt)

    def forget(self, blk: BlockNode) -> None:
        with self.lock:
            self.pending.pop(blk.id, None)
            j = self.slot_of.pop(blk.id, None)
            if j is None:
                return
            self.bits[:, j >> 3] &= np.uint8(~(1 << (j & 7)) & 0xFF)
            self._zone = None
            self.slots[j] = None
            self.filters[j] = None
            self.free.append(j)

    def forget_deleted(self, upto: int) -> int:
        """Drop the filters of blocks replaced (compacted) at or before `upto`, and of
        blocks whose every row was deleted at or before it; returns how many went.

        Why the second: a key looked up is asked of every block's filter, and each false
        positive reads that block's key column (cached for `object_cache_blocks` blocks).
        A table whose rows are deleted as they age (the requests table: the dedup window)
        would keep a filter per block of its whole history, its lookups reading key
        columns of blocks no live row is in once the blocks outnumber the cache (after
        450k one-row commits: ~0.3 key column reads per id looked up, ~1.3 ms of CPU per
        id; docs/perf-commit.md). Such a block cannot answer any lookup: a deleted row is not
        a duplicate, and a delete at or before `upto` (the oldest active StartTS or
        before) conflicts with no transaction, active or later."""
        with self.lock:
            blocks = [b for b in self.slots if b is not None] + list(self.pending.values())
        # outside the lock: a block's delete ts may be read from its object
        gone = [b for b in blocks if b.delete_ts <= upto or _all_rows_deleted(b, upto)]
        for b in gone:
            self.forget(b)
        return len(gone)

    def evict(self) -> None:
        """Drop every loaded filter (memory): each is loaded again at the next lookup."""
        with self.lock:
            for b in self.slots:
                if b is not None:
                    self.pending[b.id] = b
            self.slots, self.filters, self.free = [], [], []
            self.slot_of = {}
            self.bits = np.zeros((0, 0), dtype=np.uint8)
            self.lo = np.zeros(0, dtype=np.int64)
            self.hi = np.zeros(0, dtype=np.int64)
            self.m = 0
            self._zone = None

    def _add(self, blk: BlockNode, flt: KeyFilter) -> None:
        if not self.m:
            self.m = flt.m
        # the bits live in self.bits only; an int64 zone map in self.lo / self.hi only (a
        # KeyFilter and two ints kept per block would outlive the interval's rows among
        # them, and keep their allocator pools: docs/memory.md)
        int_zone = _is_i64(flt.lo) and _is_i64(flt.hi)
        zone = _INT_ZONE if int_zone else KeyFilter(flt.m, flt.lo, flt.hi, _NO_BITS)
        if self.free:
            j = self.free.pop()
            self.slots[j] = blk
            self.filters[j] = zone
        else:
            j = len(self.slots)
            self.slots.append(blk)
            self.filters.append(zone)
        cap = self.bits.shape[1] * 8
        if j >= cap or self.bits.shape[0] != self.m:
            grown = np.zeros((self.m, max(16, 2 * cap) // 8), dtype=np.uint8)
            if self.bits.shape[0] == self.m:
                grown[:, : self.bits.shape[1]] = self.bits
            self.bits = grown
            n = grown.shape[1] * 8
            lo, hi = np.full(n, _I64_MIN, np.int64), np.full(n, _I64_MAX, np.int64)
            lo[: len(self.lo)], hi[: len(self.hi)] = self.lo, self.hi
            self.lo, self.hi = lo, hi
        self.bits[np.nonzero(flt.bits)[0], j >> 3] |= np.uint8(1 << (j & 7))
        if int_zone:
            self.lo[j], self.hi[j] = flt.lo, flt.hi
        else:
            self.lo[j], self.hi[j] = _I64_MIN, _I64_MAX
        self.slot_of[blk.id] = j
        self._zone = None

    def _load_pending(self, reader: ObjectRows, pk: int, m: int) -> None:
        while self.pending:
            _, blk = self.pending.popitem()
            self.loads += 1
            self._add(blk, reader.key_filter(blk, pk, self.m or m))

    def candidates(
        self, keys: Sequence[Any] | np.ndarray, reader: ObjectRows, pk: int, m: int
    ) -> list[tuple[int, BlockNode]]:
        """(index in keys, block) pairs whose filter and zone map may hold the key."""
        if not len(keys):
            return []
        with self.lock:
            self._load_pending(reader, pk, m)
            if not self.slot_of:
                return []
            # the arrays and lists as they are now; the work goes on outside the lock (the
            # clients share it). A block added meanwhile may be missed: its keys are still
            # in the table's index (pruned only after its filter is registered); a slot
            # cleared or reused meanwhile can only add a candidate (one read)
            bits, lo, hi = self.bits, self.lo, self.hi
            slots, filters = list(self.slots), list(self.filters)
            n = len(slots)
            zone = self._zone
            if zone is None:  # an unzoned slot has the widest bounds: every key is inside
                zone = self._zone = (int(lo[:n].min()), int(hi[:n].max()))
            m_bits = self.m
        # keys outside every zone map (new keys of an ascending key: most inserts) are in
        # no flushed block: they cost neither a hash nor a filter probe, whatever the
        # number of blocks -- checked before anything else (a 1,000-row insert's keys
        # after a checkpoint: 10-15% of the TN's request thread; docs/perf-commit.md)
        ints = _int_keys(keys)
        at = None  # the keys asked of the filters (None: all)
        if ints is not None:
            zlo, zhi = zone
            if len(ints) <= _FEW:  # a few keys (one-row inserts): no numpy call
                near = [i for i, k in enumerate(ints.tolist()) if zlo <= k <= zhi]
                if not near:
                    return []
                if len(near) < len(ints):
                    at = np.array(near, dtype=np.intp)
            else:
                if int(ints.min()) > zhi or int(ints.max()) < zlo:
                    return []
                inside = (ints >= zlo) & (ints <= zhi)
                if not inside.all():
                    at = np.nonzero(inside)[0]
                    if not len(at):
                        return []
            hashes = key_hashes(ints if at is None else ints[at])
        else:
            hashes = key_hashes(keys)
        pos = positions(hashes, m_bits)
        hit = np.bitwise_and.reduce(bits[pos], axis=1)  # [keys, slots / 8]
        # (key, slot) pairs: the bytes with a bit set, then their bits (most bytes are 0:
        # unpacking the whole matrix cost ~5 ms per 800 keys at 1,000 blocks)
        kb, jb = np.nonzero(hit)
        bi, bo = np.nonzero(np.unpackbits(hit[kb, jb][:, None], axis=1, bitorder="little"))
        ki, sj = kb[bi], jb[bi] * 8 + bo
        if at is not None:
            ki = at[ki]
        keep = sj < len(slots)
        ki, sj = ki[keep], sj[keep]
        if ints is not None and len(ki):  # the zone maps, vectorized
            k = ints[ki]
            keep = (lo[sj] <= k) & (k <= hi[sj])
            ki, sj = ki[keep], sj[keep]
        out = []
        for i, j in zip(ki.tolist(), sj.tolist(), strict=True):
            blk, flt = slots[j], filters[j]
            if blk is None or flt is None:
                continue
            if flt is _INT_ZONE:  # checked above when the key is an int64
                if ints is None and not _int_zone_may_hold(keys[i], lo[j], hi[j]):
                    continue
            elif not flt.may_hold(keys[i]):
                continue
            out.append((i, blk))
        return out
