"""Errors of the file backend; each names the file and the byte offset."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tn.logstore.driver import LogStoreError

if TYPE_CHECKING:
    from tn.logstore.file_backend.reader import Damage


class FileLogError(LogStoreError):
    """Base class of file-backend errors."""


class RecoveryError(FileLogError):
    """Opening the log failed: its files are not a log this mode accepts."""

    def __init__(self, message: str, path: str = "", offset: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


class CorruptLogError(RecoveryError):
    """A damaged record that the recovery mode does not tolerate."""

    def __init__(self, damage: Damage, mode: str) -> None:
        super().__init__(f"{damage} (recovery mode {mode})", damage.path, damage.offset)
        self.damage = damage
