"""Replay: from what the WAL topic holds to the log's valid, contiguous entries.

The guarantee (what `replay` returns, and what the tests assert)
----------------------------------------------------------------
Let T be the durable truncation point. Replay returns exactly the entries
T+1..L where L is the end of the longest gap-free run of *valid* entries
starting at T+1. An entry is valid when:

(a) its record is of the `entries` kind, and no marker of a newer epoch
    precedes it in its partition (a zombie's late write lands after the
    new writer's marker and is ignored); and
(b) its LSN is at or below base(e') for every later epoch e' whose base is
    recorded in the meta topic (base(e') is what e' recovered to; an older
    writer's entries above it were never acknowledged and were superseded).

Consequences: every acknowledged entry above T is returned (an append is
acknowledged only once it and all before it were durable, so it sits in the
gap-free run); an entry that was durable but never acknowledged is returned
only when the run reaches it (no gap below it), i.e. it is indistinguishable
from one whose acknowledgement was lost in flight, which the driver contract
allows. Entries after the first gap (the discontinuous tail) are dropped,
entries at or below T (the discontinuous head) are skipped. If a valid
record's `kwal.acked` header claims acknowledgements above L, an
acknowledged entry is gone (retention, manual deletion) and replay raises
`AcknowledgedEntryLostError` rather than start on a shortened log.

Steps, numbered as `replay()` runs them:

1. walk each partition in offset order; markers raise the partition's fence;
   `entries` records of an older epoch than the fence are zombies;
2. clip every entry above its epoch's bound (rule b);
3. skip entries <= T (head), keep the first copy of each LSN (a producer
   retry can duplicate a record);
4. take the gap-free run from T+1; the rest is the dropped tail;
5. check the `acked` headers against the run's end;
6. check every recorded base against it too: when retention deleted every
   record above T, no `acked` header is left to tell, but a later writer's
   base still says how far the log once reached.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tn.logstore.kafka_backend.exceptions import AcknowledgedEntryLostError, FencedError
from tn.logstore.kafka_backend.headers import KIND_EPOCH, RecordHeader


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One WAL record as read back: where it is, its headers, its entries."""

    partition: int
    offset: int
    header: RecordHeader
    payloads: tuple[bytes, ...] = ()
    timestamp_ms: int = 0
    size: int = 0


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of valid LSNs [first, last] stored in one record at (partition, offset),
    starting at entry index `index` of that record."""

    first: int
    last: int
    partition: int
    offset: int
    index: int


@dataclass(frozen=True, slots=True)
class RecordInfo:
    """What truncation and retention need to know of any record, valid or not."""

    partition: int
    offset: int
    max_lsn: int  # 0 for markers
    timestamp_ms: int
    size: int


@dataclass
class ReplayResult:
    truncated: int
    last_lsn: int
    entries: EntryMap = field(default_factory=lambda: EntryMap())  # T+1..last_lsn
    segments: list[Segment] = field(default_factory=list)
    head_skipped: int = 0
    tail_dropped: list[int] = field(default_factory=list)
    zombies_ignored: int = 0
    max_acked: int = 0


def epoch_bounds(bases: Mapping[int, int], epochs: Iterable[int]) -> dict[int, int]:
    """bound(e) = min(base(e') for recorded e' > e); absent when no later base is recorded."""
    out: dict[int, int] = {}
    for e in set(epochs):
        later = [b for ep, b in bases.items() if ep > e]
        if later:
            out[e] = min(later)
    return out


def record_info(rec: StoredRecord) -> RecordInfo:
    max_lsn = 0 if rec.header.kind == KIND_EPOCH else rec.header.last
    return RecordInfo(rec.partition, rec.offset, max_lsn, rec.timestamp_ms, rec.size)


def replay(
    records: Iterable[StoredRecord], truncated: int, bases: Mapping[int, int], epoch: int
) -> ReplayResult:
    """Rebuild the log from stored records (module docstring, steps 1-6).

    `records` must be in offset order within each partition (any interleaving
    across partitions). `epoch` is the replaying writer's own, new epoch.

    The rules are per LSN, but a record's LSNs are contiguous, so each is applied to
    a record's LSN range at once: the clip (2) and the head (3) cut a range's ends,
    the first copy (3) is an interval set (`_Claims`) that a later copy's range only
    fills where no earlier copy already is. No work per LSN, except for the dropped
    tail's list.
    """
    recs = list(records)
    bounds = epoch_bounds(bases, (r.header.epoch for r in recs))
    result = ReplayResult(truncated=truncated, last_lsn=truncated)
    fence: dict[int, int] = {}
    claims = _Claims()
    for rec in recs:
        h = rec.header
        # 1. fences and zombies
        if h.kind == KIND_EPOCH:
            fence[rec.partition] = max(fence.get(rec.partition, 0), h.epoch)
            continue
        if h.epoch >= epoch:
            raise FencedError(f"the WAL holds a record of epoch {h.epoch} >= this writer's {epoch}")
        if h.epoch < fence.get(rec.partition, 0):
            result.zombies_ignored += h.count
            continue
        bound = bounds.get(h.epoch)
        result.max_acked = max(result.max_acked, h.acked if bound is None else min(h.acked, bound))
        n = len(rec.payloads)
        if not n:
            continue
        first, last = h.first, h.first + n - 1
        # 2. clip above the epoch's bound
        hi = last if bound is None else min(last, bound)
        if hi < last:
            result.zombies_ignored += last - max(hi, first - 1)
        # 3. head; first copy wins
        if first <= truncated and first <= hi:
            result.head_skipped += min(hi, truncated) - first + 1
        lo = max(first, truncated + 1)
        if lo <= hi:
            claims.claim(lo, hi, rec)
    # 4. the gap-free run from T+1 (claims hold only LSNs above T, in disjoint ranges)
    los, his, owners = claims.los, claims.his, claims.owners
    entries = result.entries
    lsn = truncated + 1
    i = 0
    while i < len(los) and los[i] == lsn:
        rec = owners[i]
        first = rec.header.first
        seg = result.segments[-1] if result.segments else None
        if seg is not None and seg.partition == rec.partition and seg.offset == rec.offset:
            result.segments[-1] = Segment(seg.first, his[i], seg.partition, seg.offset, seg.index)
            entries.extend_last(his[i])
        else:
            result.segments.append(Segment(lsn, his[i], rec.partition, rec.offset, lsn - first))
            entries.add(lsn, his[i], rec.payloads, first)
        lsn = his[i] + 1
        i += 1
    result.last_lsn = lsn - 1
    result.tail_dropped = [x for j in range(i, len(los)) for x in range(los[j], his[j] + 1)]
    # 5. acknowledged entries must all be in the run
    if result.max_acked > result.last_lsn:
        raise AcknowledgedEntryLostError(
            f"a WAL record says LSN {result.max_acked} was acknowledged, but the log holds a "
            f"gap-free run only through {result.last_lsn} (truncation point {truncated}); "
            "entries were deleted (retention?) — refusing to replay a shortened log"
        )
    # 6. so must every earlier writer's recovered base (the records that said so may be gone)
    recorded = max(bases.values(), default=0)
    if recorded > result.last_lsn:
        raise AcknowledgedEntryLostError(
            f"an earlier writer recovered the log through LSN {recorded} (its base on the meta "
            f"topic), but the log holds a gap-free run only through {result.last_lsn} "
            f"(truncation point {truncated}); entries were deleted (retention?) — refusing to "
            "replay a shortened log"
        )
    return result


class _Claims:
    """Disjoint LSN ranges, sorted, each with the record that holds it: the first copy of
    each LSN (`replay` step 3). `claim` adds the parts of a range no earlier range holds,
    so a later copy of a record (a producer retry, a fenced writer's duplicate) fills
    only what the earlier ones left."""

    __slots__ = ("los", "his", "owners")

    def __init__(self) -> None:
        self.los: list[int] = []
        self.his: list[int] = []
        self.owners: list[StoredRecord] = []

    def claim(self, lo: int, hi: int, owner: StoredRecord) -> None:
        los, his = self.los, self.his
        i = bisect_right(los, lo)  # the first range starting after lo
        if i and his[i - 1] >= lo:  # the one before holds lo: start after it
            lo = his[i - 1] + 1
        while lo <= hi:
            if i < len(los) and los[i] <= hi:  # a range held already inside [lo, hi]
                if los[i] > lo:
                    self._insert(i, lo, los[i] - 1, owner)
                    i += 1
                lo = his[i] + 1
                i += 1
            else:
                self._insert(i, lo, hi, owner)
                return

    def _insert(self, i: int, lo: int, hi: int, owner: StoredRecord) -> None:
        if i == len(self.los):  # the common case: records come in LSN order
            self.los.append(lo)
            self.his.append(hi)
            self.owners.append(owner)
        else:
            self.los.insert(i, lo)
            self.his.insert(i, hi)
            self.owners.insert(i, owner)


class EntryMap(Mapping[int, bytes]):
    """LSN -> payload of the recovered run, held as ranges (one per record part), not one
    dict item per LSN: the payload of `lsn` in a range is its record's
    ``payloads[lsn - first]``.

    Built once by `replay` (`add`, `extend_last`), then only read and truncated
    (`drop_through`), which replaces the lists as a whole: a reader on another thread
    holds either the lists before or after, never a half-shifted one."""

    __slots__ = ("_spans", "_hint")

    def __init__(self) -> None:
        # (los, his, payloads, firsts): range i is los[i]..his[i] of a record whose
        # payloads[0] is at LSN firsts[i]
        self._spans: tuple[list[int], list[int], list[Sequence[bytes]], list[int]] = (
            [],
            [],
            [],
            [],
        )
        self._hint = 0  # the range the last lookup found (reads go in LSN order)

    def add(self, lo: int, hi: int, payloads: Sequence[bytes], first: int) -> None:
        """Append the range lo..hi (above every range held) of a record starting at `first`."""
        los, his, pays, firsts = self._spans
        if his and lo <= his[-1]:
            raise ValueError(f"range {lo}..{hi} is not above the last one ({his[-1]})")
        los.append(lo)
        his.append(hi)
        pays.append(payloads)
        firsts.append(first)

    def extend_last(self, hi: int) -> None:
        self._spans[1][-1] = hi

    def _payload(self, lsn: int) -> bytes | None:
        los, his, pays, firsts = self._spans
        i = self._hint
        if not (i < len(los) and los[i] <= lsn <= his[i]):
            i = bisect_right(los, lsn) - 1
            if i < 0 or lsn > his[i]:
                return None
            self._hint = i
        return pays[i][lsn - firsts[i]]

    def __getitem__(self, lsn: int) -> bytes:
        payload = self._payload(lsn)
        if payload is None:
            raise KeyError(lsn)
        return payload

    def get(self, lsn: int, default: Any = None) -> Any:
        payload = self._payload(lsn)
        return default if payload is None else payload

    def __contains__(self, lsn: object) -> bool:
        return isinstance(lsn, int) and self._payload(lsn) is not None

    def __iter__(self) -> Iterator[int]:
        los, his, _, _ = self._spans
        for lo, hi in zip(los, his, strict=True):
            yield from range(lo, hi + 1)

    def __len__(self) -> int:
        los, his, _, _ = self._spans
        return sum(hi - lo + 1 for lo, hi in zip(los, his, strict=True))

    def drop_through(self, lsn: int) -> None:
        """Forget every LSN <= lsn (truncation)."""
        los, his, pays, firsts = self._spans
        i = bisect_right(his, lsn)  # ranges wholly at or below lsn
        los = los[i:]
        if los and los[0] <= lsn:
            los[0] = lsn + 1
        self._spans = (los, his[i:], pays[i:], firsts[i:])


def deletable_offsets(infos: Iterable[RecordInfo], truncated: int) -> dict[int, int]:
    """Per partition, the offset before which every record holds only LSNs <= truncated.

    This is seed 004's rule: DeleteRecords may remove a prefix of a partition,
    and only a prefix of records whose entries are all at or below the logical
    truncation point. Markers hold no entries and never block.
    """
    by_part: dict[int, list[RecordInfo]] = {}
    for info in infos:
        by_part.setdefault(info.partition, []).append(info)
    out: dict[int, int] = {}
    for p, rows in by_part.items():
        rows.sort(key=lambda r: r.offset)
        before = rows[-1].offset + 1
        for r in rows:
            if r.max_lsn > truncated:
                before = r.offset
                break
        out[p] = before
    return out
