"""The file log backend: leveldb-format segment files with group commit.

Public API::

    FileDriver(directory, segment_bytes=64 << 20, recovery_mode="point-in-time",
               group_max_entries=512, group_max_bytes=1 << 20,
               *, preallocate_bytes=1 << 20, read_only=False)
        a `tn.logstore.driver.LogDriver`; `.recovery` is the RecoveryReport of
        the open (what was skipped, where the log was cut, segments set aside).
    RecoveryMode        point-in-time | tolerate-corrupted-tail |
                        absolute-consistency | skip-any-corrupted
    RecoveryError       the log cannot be opened (e.g. segments missing)
    CorruptLogError     damage the mode does not tolerate; `.damage`, `.path`, `.offset`
    Damage, DamageKind  what the reader found, where

Modules: `format` (block/record layout), `writer` and `reader` (leveldb's log
writer and reader), `segments` (segment files, truncation point), `recovery`
(recovery modes), `driver` (`FileDriver`), `exceptions`.
"""

from tn.logstore.file_backend.driver import FileDriver
from tn.logstore.file_backend.exceptions import CorruptLogError, FileLogError, RecoveryError
from tn.logstore.file_backend.reader import Damage, DamageKind
from tn.logstore.file_backend.recovery import RecoveryMode, RecoveryReport

__all__ = [
    "CorruptLogError",
    "Damage",
    "DamageKind",
    "FileDriver",
    "FileLogError",
    "RecoveryError",
    "RecoveryMode",
    "RecoveryReport",
]
