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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

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
    entries: dict[int, bytes] = field(default_factory=dict)  # T+1..last_lsn
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
    """Rebuild the log from stored records (module docstring, steps 1-5).

    `records` must be in offset order within each partition (any interleaving
    across partitions). `epoch` is the replaying writer's own, new epoch.
    """
    recs = list(records)
    bounds = epoch_bounds(bases, (r.header.epoch for r in recs))
    result = ReplayResult(truncated=truncated, last_lsn=truncated)
    fence: dict[int, int] = {}
    found: dict[int, tuple[bytes, int, int, int]] = {}  # lsn -> (payload, partition, offset, index)
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
        for i, payload in enumerate(rec.payloads):
            lsn = h.first + i
            # 2. clip above the epoch's bound
            if bound is not None and lsn > bound:
                result.zombies_ignored += 1
                continue
            # 3. head; first copy wins
            if lsn <= truncated:
                result.head_skipped += 1
                continue
            found.setdefault(lsn, (payload, rec.partition, rec.offset, i))
    # 4. the gap-free run from T+1
    lsn = truncated + 1
    seg: list[int] = []  # [first, last, partition, offset, index]
    while lsn in found:
        payload, p, off, i = found.pop(lsn)
        result.entries[lsn] = payload
        if seg and seg[2] == p and seg[3] == off and seg[1] == lsn - 1:
            seg[1] = lsn
        else:
            if seg:
                result.segments.append(Segment(*seg))
            seg = [lsn, lsn, p, off, i]
        lsn += 1
    if seg:
        result.segments.append(Segment(*seg))
    result.last_lsn = lsn - 1
    result.tail_dropped = sorted(found)
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
