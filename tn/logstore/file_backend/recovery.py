"""Recovery: scan the segments, apply the recovery mode, repair the tail.

Modes, named as RocksDB names its WAL recovery modes:

=========================  ===================  ==========================
mode                       torn tail at EOF     corruption elsewhere
=========================  ===================  ==========================
point-in-time (default)    cut it               stop there: cut the file,
                                                set later segments aside
tolerate-corrupted-tail    cut it               CorruptLogError
absolute-consistency       CorruptLogError      CorruptLogError
skip-any-corrupted         cut it               skip it, report, go on
=========================  ===================  ==========================

A *torn tail* is damage of a tail kind (`reader.TAIL_KINDS`: torn header,
torn payload, FIRST without LAST, a bad crc on the last record) followed by
nothing but EOF or zeros, in the newest segment: what a crash in the middle
of a write leaves. Zeros to EOF alone are no damage: the writer preallocates.

Protocol (`recover`):

1. Read the truncation point.
2. For each segment in LSN order, read its records (`reader.LogReader`).
3. Check each record's LSN: at least 8 bytes; the first one not above
   truncation point + 1 (else segments are missing: RecoveryError, except in
   skip-any-corrupted); then each exactly one above its predecessor, except
   that after entries at or below the truncation point the log may resume at
   any LSN up to truncation point + 1.
4. Hand each damage to `policy` -- the one place that decides.
5. On CUT: truncate the segment after its last good record and rename every
   later segment to ``*.dropped``; the log ends there.
6. The result: the segments with their valid size and index, the last LSN,
   what was skipped and where the log was cut.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from pathlib import Path

from tn.logstore.file_backend.exceptions import CorruptLogError, RecoveryError
from tn.logstore.file_backend.format import LSN_SIZE, decode_lsn
from tn.logstore.file_backend.reader import TAIL_KINDS, Damage, DamageKind, LogReader, Record
from tn.logstore.file_backend.segments import (
    DROPPED_SUFFIX,
    Segment,
    fsync_dir,
    list_segments,
)


class RecoveryMode(StrEnum):
    POINT_IN_TIME = "point-in-time"
    TOLERATE_CORRUPTED_TAIL = "tolerate-corrupted-tail"
    ABSOLUTE_CONSISTENCY = "absolute-consistency"
    SKIP_ANY_CORRUPTED = "skip-any-corrupted"

    @classmethod
    def parse(cls, value: str | RecoveryMode) -> RecoveryMode:
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown recovery mode {value!r} (one of {names})") from None


class Action(Enum):
    CUT = "cut the log here"
    SKIP = "skip the damaged bytes and go on"
    ACCEPT = "report, but keep the record"
    FAIL = "raise CorruptLogError"


def policy(mode: RecoveryMode, damage: Damage, tail: bool) -> Action:
    """What `mode` does with `damage`; `tail` when it is a torn tail of the newest segment."""
    if mode is RecoveryMode.ABSOLUTE_CONSISTENCY:
        return Action.FAIL
    if tail:
        return Action.CUT
    if mode is RecoveryMode.POINT_IN_TIME:
        return Action.CUT
    if mode is RecoveryMode.TOLERATE_CORRUPTED_TAIL:
        return Action.FAIL
    return Action.ACCEPT if damage.kind is DamageKind.LSN_GAP else Action.SKIP


@dataclass
class RecoveryReport:
    mode: RecoveryMode
    truncated: int
    segments: list[Segment] = field(default_factory=list)
    last_lsn: int = 0  # highest accepted LSN (0: none)
    skipped: list[Damage] = field(default_factory=list)
    cut: Damage | None = None
    dropped: list[Path] = field(default_factory=list)
    dirty_tail: bool = False  # the newest segment still holds skipped damage


def _check_lsn(record: Record, prev: int, truncated: int, path: str) -> tuple[int, Damage | None]:
    """Step 3: the record's LSN and the damage its LSN shows, if any."""
    size = record.end - record.offset
    if len(record.data) < LSN_SIZE:
        return 0, Damage(DamageKind.SHORT_RECORD, path, record.offset, size, False)
    lsn = decode_lsn(record.data)
    # Entries at or below the truncation point are disposable: after them, the
    # log may go on at any LSN up to truncated + 1.
    highest_ok = max(prev, truncated) + 1
    if prev < lsn <= highest_ok and (lsn == prev + 1 or prev <= truncated):
        return lsn, None
    if prev == 0:
        detail = f"first LSN {lsn}, truncated only to {truncated}: segments are missing"
        return lsn, Damage(DamageKind.LSN_GAP, path, record.offset, size, False, detail)
    kind = DamageKind.LSN_GAP if lsn > prev else DamageKind.LSN_REGRESSION
    return lsn, Damage(kind, path, record.offset, size, False, f"LSN {lsn} after {prev}")


def recover(
    directory: Path, truncated: int, mode: RecoveryMode, repair: bool = True
) -> RecoveryReport:
    """Steps 2-6 of the module docstring (step 1 is the caller's)."""
    report = RecoveryReport(mode, truncated)
    files = list_segments(directory)
    prev = 0
    for i, (first_lsn, path) in enumerate(files):
        newest = i == len(files) - 1
        seg = Segment(first_lsn, path)
        cut: Damage | None = None
        with open(path, "rb") as f:
            for ev in LogReader(f, str(path)):
                damage: Damage | None
                if isinstance(ev, Record):
                    lsn, damage = _check_lsn(ev, prev, truncated, str(path))
                    if damage is None:
                        _accept(seg, lsn, ev)
                        prev = lsn
                        continue
                    missing_head = prev == 0 and damage.kind is DamageKind.LSN_GAP
                    if missing_head and mode is not RecoveryMode.SKIP_ANY_CORRUPTED:
                        raise RecoveryError(str(damage), damage.path, damage.offset)
                else:
                    damage = ev
                tail = newest and damage.at_eof and damage.kind in TAIL_KINDS
                action = policy(mode, damage, tail)
                if action is Action.FAIL:
                    raise CorruptLogError(damage, mode.value)
                if action is Action.CUT:
                    cut = damage
                    break
                report.skipped.append(damage)
                if action is Action.ACCEPT and isinstance(ev, Record):
                    _accept(seg, lsn, ev)
                    prev = lsn
                elif newest:
                    report.dirty_tail = True
        report.segments.append(seg)
        if cut is not None:  # step 5
            report.cut = cut
            if repair:
                _cut(seg, files[i + 1 :], report)
            break
    report.last_lsn = prev
    return report


def _accept(seg: Segment, lsn: int, record: Record) -> None:
    if seg.last_lsn == 0:
        seg.first_lsn = lsn
    seg.note(lsn, record.offset)
    seg.last_lsn = lsn
    seg.size = record.end


def _cut(seg: Segment, later: list[tuple[int, Path]], report: RecoveryReport) -> None:
    fd = os.open(seg.path, os.O_WRONLY)
    try:
        os.ftruncate(fd, seg.size)
        os.fsync(fd)
    finally:
        os.close(fd)
    for _, path in later:
        aside = path.with_name(path.name + DROPPED_SUFFIX)
        os.replace(path, aside)
        report.dropped.append(aside)
    if later:
        fsync_dir(seg.path.parent)
