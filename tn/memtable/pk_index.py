"""The primary-key index without a Python object per key (issue 33, docs/memory.md).

`PkIndex` maps key -> (block id, row, ts, live): the newest write of each key of the
working set. Integer keys (the common primary-key type) live in sorted numpy **runs**
(parallel arrays: keys, block id, row, ts, live), newest run first; a small Python dict
(`recent`, at most `recent_max` entries) takes single-key writes and shadows the runs.
Why: a dict entry, a tuple and an int per key are long-lived small objects that stay
interleaved in pymalloc's pools with the requests' short-lived ones, so those pools
never empty and the arenas keep the largest working set the TN has had; the arrays
live in glibc's heap, which `malloc_trim` returns, and the collector does not walk them.

1. A bulk write (`set_many`) of at least `run_min` keys becomes a run of its own
   (sorted, duplicates resolved last-wins); a smaller one, or a single `set`, goes into
   `recent`, which becomes a run when it passes `recent_max` entries.
2. Runs are merged log-structured: while the newest run is at least 1/`MERGE_RATIO` the
   size of the next, the two merge (the newer entry of a key wins), so a lookup
   touches about log_MERGE_RATIO(n / run_min) runs, one `np.searchsorted` each for a
   whole batch of keys (a run whose key range misses the batch is skipped). A run of
   `MERGE_MAX` entries or more is merged only by `prune` (the checkpoint's thread):
   a writer holds the commit pipeline's lock, which a merge of a large run would stall.
3. A key may be in several places (recent, then runs newest first): the first wins.
   `prune` drops an entry only together with the older entries of its key (an older
   entry must never resurface), and merges drop shadowed entries.

Other key types (strings, floats, ...) keep every entry in `recent` (no runs).

Writers are serialized by the caller (`TableData.index_lock`). Readers take no lock:
a writer never changes a run's arrays nor a dict a reader may hold in place except to
add to `recent`; it publishes new runs (`_runs`, a tuple) before a new `recent`, and a
reader reads `_recent` before `_runs`, so it sees the state before or after a change.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from typing import Any

import numpy as np

Entry = tuple[int, int, int, bool]  # (block id, row, ts, live)

RECENT_MAX = 4096  # entries of `recent` before it becomes a run
RUN_MIN = 64  # a bulk write of at least this many keys becomes a run
MERGE_RATIO = 4  # runs merge while the newer is >= 1/MERGE_RATIO of the older
MERGE_MAX = 1 << 17  # ...and the older has fewer entries (a merge stalls the writers)
SMALL = 16  # key sets up to this size are looked up key by key


class _Run:
    """Sorted unique int64 keys and their entries as parallel arrays (never changed in
    place once published)."""

    __slots__ = ("keys", "blk", "row", "ts", "live", "lo", "hi")

    def __init__(
        self, keys: np.ndarray, blk: np.ndarray, row: np.ndarray, ts: np.ndarray, live: np.ndarray
    ) -> None:
        self.keys = keys
        # the smallest and largest key, as Python ints: a key outside skips the run
        # (new keys of an ascending key: most inserts) without a call into numpy
        self.lo = int(keys[0]) if len(keys) else 1
        self.hi = int(keys[-1]) if len(keys) else 0
        self.blk = blk
        self.row = row
        self.ts = ts
        self.live = live

    def __len__(self) -> int:
        return len(self.keys)

    def take(self, sel: np.ndarray) -> _Run:
        return _Run(self.keys[sel], self.blk[sel], self.row[sel], self.ts[sel], self.live[sel])

    def entry(self, i: int) -> Entry:
        return (int(self.blk[i]), int(self.row[i]), int(self.ts[i]), bool(self.live[i]))

    def find(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(hit mask over q, positions in this run; valid where hit)."""
        n = len(self.keys)
        if n == 0 or not len(q) or q.min() > self.hi or q.max() < self.lo:
            return np.zeros(len(q), dtype=bool), np.zeros(len(q), dtype=np.intp)
        pos = np.searchsorted(self.keys, q)
        posc = np.minimum(pos, n - 1)
        return (pos < n) & (self.keys[posc] == q), posc

    @staticmethod
    def merge(newer: _Run, older: _Run) -> _Run:
        return _Run.merge_all((newer, older))

    @staticmethod
    def merge_all(runs: Sequence[_Run]) -> _Run:
        """One run of `runs` (newest first): the newest entry of each key."""
        if len(runs) == 1:
            return runs[0]
        by_lo = sorted((r for r in runs if len(r)), key=lambda r: r.lo)
        if all(a.hi < b.lo for a, b in zip(by_lo, by_lo[1:], strict=False)):
            # key ranges apart (ascending keys: most inserts): no key in two runs, the
            # runs laid end to end are sorted already -- no sort, no gather
            if not by_lo:
                return runs[0]

            def joined(name: str) -> np.ndarray:
                return np.concatenate([getattr(r, name) for r in by_lo])

            return _Run(joined("keys"), joined("blk"), joined("row"), joined("ts"), joined("live"))
        keys = np.concatenate([r.keys for r in runs])
        order = np.argsort(keys, kind="stable")  # equal keys: the newer first
        ks = keys[order]
        first = np.ones(len(ks), dtype=bool)
        first[1:] = ks[1:] != ks[:-1]
        sel = order[first]

        def cat(name: str) -> np.ndarray:
            return np.concatenate([getattr(r, name) for r in runs])[sel]

        return _Run(ks[first], cat("blk"), cat("row"), cat("ts"), cat("live"))


_EMPTY = (1 << 63, -(1 << 63))  # (lo, hi) of no key


def _is_int(k: Any) -> bool:
    return (type(k) is int) or isinstance(k, np.integer)


def _col(v: Any, n: int, dtype: Any) -> np.ndarray:
    """A scalar or per-key sequence as an array of n."""
    if isinstance(v, int | bool | np.integer | np.bool_):  # np.full: ~4x cheaper than a broadcast
        return np.full(n, v, dtype=dtype)
    return np.asarray(v, dtype=dtype)


def _values(v: Any, n: int, dtype: Any) -> list[Any]:
    """A scalar or per-key sequence as a list of n Python values."""
    if isinstance(v, bool | np.bool_):
        return [bool(v)] * n
    if isinstance(v, int | np.integer):
        return [int(v)] * n
    return list(np.asarray(v, dtype=dtype).tolist())


class PkIndex:
    """key -> (block id, row, ts, live) of the key's newest write (see the module doc)."""

    __slots__ = ("_recent", "_runs", "_ints", "_rlo", "_rhi", "recent_max", "run_min")

    def __init__(self, recent_max: int = RECENT_MAX, run_min: int = RUN_MIN) -> None:
        self._recent: dict[Any, Entry] = {}
        self._runs: tuple[_Run, ...] = ()  # newest first
        self._ints: bool | None = None  # int keys (runs), decided by the first write
        # int keys: a range holding every key of `recent` (batches outside it skip the
        # dict). Widened before a key is added, narrowed after `recent` is replaced; a
        # reader reads it before `recent`
        self._rlo, self._rhi = _EMPTY
        self.recent_max = recent_max
        self.run_min = run_min

    # -- reads (no lock) ------------------------------------------------------
    def get(self, key: Any) -> Entry | None:
        recent = self._recent
        runs = self._runs
        e = recent.get(key)
        if e is not None or not runs or not _is_int(key):
            return e
        for run in runs:
            if key > run.hi or key < run.lo:
                continue
            keys = run.keys
            i = int(keys.searchsorted(key))
            if i < len(keys) and keys[i] == key:
                return run.entry(i)
        return None

    def get_many(self, keys: Sequence[Any]) -> list[Entry | None]:
        """Each key's entry (None: not in the index), in the order of `keys`."""
        runs = self._runs
        q = self._ints_of(keys) if runs and len(keys) > SMALL else None
        if q is None:
            return [self.get(k) for k in keys] if runs else [self._recent.get(k) for k in keys]
        hit, blk, row, ts, live = self.find_many(q)
        out: list[Entry | None] = [None] * len(keys)
        for i, b, r, t, lv in zip(
            np.flatnonzero(hit).tolist(),
            blk[hit].tolist(),
            row[hit].tolist(),
            ts[hit].tolist(),
            live[hit].tolist(),
            strict=True,
        ):
            out[i] = (b, r, t, lv)
        return out

    def find_many(
        self, q: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Each key's newest entry, for an int64 key array, as arrays: (hit, block id,
        row, ts, live), each of len(q); the entries are valid where hit. No Python object
        per key but for the keys `recent` may hold (`get_many` builds on it)."""
        n = len(q)
        lo, hi = self._rlo, self._rhi
        recent = self._recent
        runs = self._runs
        hit = np.zeros(n, dtype=bool)
        blk = np.zeros(n, dtype=np.int64)
        row = np.zeros(n, dtype=np.int64)
        ts = np.zeros(n, dtype=np.int64)
        live = np.zeros(n, dtype=bool)
        if not n or (not recent and not runs):
            return hit, blk, row, ts, live
        if not self._ints:  # keys of another type: the index holds no int key
            for i, e in enumerate(self.get_many(q.tolist())):
                if e is not None:
                    hit[i] = True
                    blk[i], row[i], ts[i], live[i] = e
            return hit, blk, row, ts, live
        at = np.arange(n)
        if recent:  # recent's entries shadow the runs'
            near = np.flatnonzero((q >= lo) & (q <= hi))
            if len(near):
                for i, k in zip(near.tolist(), q[near].tolist(), strict=True):
                    e = recent.get(k)
                    if e is not None:
                        hit[i] = True
                        blk[i], row[i], ts[i], live[i] = e
                if hit.any():
                    at = np.flatnonzero(~hit)
                    q = q[at]
        if not len(q):
            return hit, blk, row, ts, live
        qlo, qhi = int(q.min()), int(q.max())  # of the keys asked: a run outside is skipped
        for run in runs:
            if not len(q):
                break
            if run.lo > qhi or run.hi < qlo:
                continue
            h, pos = run.find(q)
            if h.any():
                p, a = pos[h], at[h]
                hit[a] = True
                blk[a] = run.blk[p]
                row[a] = run.row[p]
                ts[a] = run.ts[p]
                live[a] = run.live[p]
                miss = ~h
                q, at = q[miss], at[miss]
        return hit, blk, row, ts, live

    def newer_than(self, keys: Collection[Any], ts: int) -> Any:
        """A key of `keys` whose newest write is after ts (the write-write conflict
        check), else None."""
        lo, hi = self._rlo, self._rhi
        recent = self._recent
        runs = self._runs
        q = self._ints_of(keys) if runs and len(keys) > SMALL else None
        if q is None:
            for k in keys.tolist() if isinstance(keys, np.ndarray) else keys:
                e = self.get(k) if runs else recent.get(k)
                if e is not None and e[2] > ts:
                    return k
            return None
        near = (q >= lo) & (q <= hi) if recent else None
        if near is not None and near.any():  # recent's entries shadow the runs'
            seen = np.zeros(len(q), dtype=bool)
            for i in np.flatnonzero(near).tolist():
                e = recent.get(int(q[i]))
                if e is not None:
                    if e[2] > ts:
                        return int(q[i])
                    seen[i] = True
            q = q[~seen]
        for run in runs:
            if not len(q):
                break
            hit, pos = run.find(q)
            if hit.any():
                late = hit.copy()
                late[hit] = run.ts[pos[hit]] > ts
                if late.any():
                    return int(q[int(np.argmax(late))])
                q = q[~hit]
        return None

    def _ints_of(self, keys: Collection[Any]) -> np.ndarray | None:
        """keys as an int64 array, if this index keeps runs of int keys and they are."""
        if not self._ints:
            return None
        try:
            if isinstance(keys, np.ndarray):
                return keys.astype(np.int64, copy=False)
            if isinstance(keys, list | tuple):
                return np.array(keys, dtype=np.int64)
            return np.fromiter(keys, dtype=np.int64, count=len(keys))
        except (TypeError, ValueError, OverflowError):
            return None

    def __len__(self) -> int:
        runs = self._runs
        if not runs:
            return len(self._recent)
        return len(self._key_array())

    def __iter__(self) -> Iterator[Any]:
        """The keys (a snapshot; for tests and diagnostics: it builds them all)."""
        if not self._runs:
            return iter(list(self._recent))
        return iter(self._key_array().tolist())

    def __contains__(self, key: Any) -> bool:
        return self.get(key) is not None

    def _key_array(self) -> np.ndarray:
        recent = self._recent
        runs = self._runs
        parts = [r.keys for r in runs]
        parts.append(np.array(list(recent), dtype=np.int64))
        return np.unique(np.concatenate(parts))

    def stats(self) -> dict[str, int]:
        """What the index holds (diagnostics)."""
        runs = self._runs
        return {
            "recent": len(self._recent),
            "runs": len(runs),
            "run_entries": sum(len(r) for r in runs),
            "run_bytes": sum(
                r.keys.nbytes + r.blk.nbytes + r.row.nbytes + r.ts.nbytes + r.live.nbytes
                for r in runs
            ),
        }

    # -- writes (the caller holds the index lock) -------------------------------
    def set(self, key: Any, bid: int, row: int, ts: int, live: bool) -> None:
        if self._ints is None:
            self._ints = _is_int(key)
        if self._ints:
            if key < self._rlo:
                self._rlo = key
            if key > self._rhi:
                self._rhi = key
        self._recent[key] = (bid, row, ts, live)
        if self._ints and len(self._recent) > self.recent_max:
            self._freeze()

    def set_many(
        self,
        keys: Sequence[Any] | np.ndarray,
        bid: int | Sequence[int] | np.ndarray,
        rows: int | Sequence[int] | np.ndarray,
        ts: int | Sequence[int] | np.ndarray,
        live: bool | Sequence[bool] | np.ndarray,
    ) -> None:
        """Set keys[i] -> (bid[i], rows[i], ts[i], live[i]), in order (a key given twice
        takes its last); each of bid, rows, ts, live is one value for all or one per key."""
        n = len(keys)
        if n == 0:
            return
        if self._ints is None:
            self._ints = _is_int(keys[0])
        if not self._ints or n < self.run_min:
            b = _values(bid, n, np.int64)
            r = _values(rows, n, np.int64)
            t = _values(ts, n, np.int64)
            lv = _values(live, n, bool)
            recent = self._recent
            kl = keys.tolist() if isinstance(keys, np.ndarray) else keys
            if self._ints:
                self._rlo, self._rhi = min(self._rlo, min(kl)), max(self._rhi, max(kl))
            # zip, not an index loop: the tuples are built and stored in C, in key order
            # (a key given twice takes its last, as documented)
            recent.update(zip(kl, zip(b, r, t, lv, strict=True), strict=True))
            if self._ints and len(recent) > self.recent_max:
                self._freeze()
            return
        k = np.asarray(keys, dtype=np.int64)
        b_a = _col(bid, n, np.int64)
        r_a = _col(rows, n, np.int32)
        t_a = _col(ts, n, np.int64)
        l_a = _col(live, n, bool)
        if n > 1 and bool(np.all(k[1:] > k[:-1])):
            run = _Run(k.copy(), b_a.copy(), r_a.copy(), t_a.copy(), l_a.copy())
        else:  # sorted, the last of each key
            u, last = np.unique(k[::-1], return_index=True)
            sel = n - 1 - last
            run = _Run(u, b_a[sel], r_a[sel], t_a[sel], l_a[sel])
        recent = self._recent
        self._push(run)
        if recent:  # the run is newer than recent's entries of its keys
            near = run.keys[(run.keys >= self._rlo) & (run.keys <= self._rhi)]
            stale = [x for x in near.tolist() if x in recent]
            if stale:
                fresh = dict(recent)
                for x in stale:
                    fresh.pop(x, None)
                self._recent = fresh

    def _freeze(self) -> None:
        """`recent` becomes a run (the newest)."""
        recent = self._recent
        if not recent:
            return
        items = sorted(recent.items())
        keys = np.fromiter((k for k, _ in items), dtype=np.int64, count=len(items))
        ents = np.array([e for _, e in items], dtype=np.int64).reshape(len(items), 4)
        blk, row, ts, live = ents.T
        self._push(_Run(keys, blk.copy(), row.astype(np.int32), ts.copy(), live.astype(bool)))
        self._recent = {}
        self._rlo, self._rhi = _EMPTY

    def _push(self, run: _Run) -> None:
        runs = list(self._runs)
        while runs and len(run) * MERGE_RATIO >= len(runs[0]) and len(runs[0]) < MERGE_MAX:
            run = _Run.merge(run, runs.pop(0))
        runs.insert(0, run)
        self._runs = tuple(runs)

    def prune(self, bids: Collection[int], upto: int) -> tuple[int, dict[int, list[Any]]]:
        """Drop the entries pointing at a block of `bids` written at or before `upto`.
        The runs are first merged into one (which drops the entries they shadowed), so a
        dropped entry can never let an older one of its key resurface. Returns (keys
        whose entry went, block id -> keys of entries pointing at it that were newer
        than upto: kept)."""
        kept: dict[int, list[Any]] = {}
        if not bids:
            return 0, kept
        bset = set(bids)
        dropped = 0
        gone: list[Any] = []
        recent: dict[Any, Entry] = {}
        for k, e in self._recent.items():
            if e[0] in bset:
                if e[2] <= upto:
                    dropped += 1
                    gone.append(k)
                    continue
                kept.setdefault(e[0], []).append(k)
            recent[k] = e
        runs = self._runs
        if runs:
            run = _Run.merge_all(runs)
            inb = np.isin(run.blk, np.fromiter(bset, dtype=np.int64, count=len(bset)))
            cond = inb & (run.ts <= upto)
            stay = inb & ~cond
            if stay.any():
                for b, key in zip(run.blk[stay].tolist(), run.keys[stay].tolist(), strict=True):
                    if key not in recent:  # else: shadowed, and what recent says stays
                        kept.setdefault(b, []).append(key)
            if self._recent:  # entries recent shadows: dropped, not counted
                shadow = np.isin(run.keys, np.array(list(self._recent), dtype=np.int64))
                dropped += int(np.count_nonzero(cond & ~shadow))
                if gone:  # a key whose recent entry went loses its older ones too
                    cond |= np.isin(run.keys, np.array(gone, dtype=np.int64))
            else:
                dropped += int(np.count_nonzero(cond))
            run = run.take(~cond) if cond.any() else run
            self._runs = (run,) if len(run) else ()
        self._recent = recent
        if self._ints:
            self._rlo, self._rhi = (min(recent), max(recent)) if recent else _EMPTY
        return dropped, kept
