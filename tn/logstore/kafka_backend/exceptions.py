"""Typed errors of the Kafka log backend. All derive from `LogStoreError`."""

from __future__ import annotations

from tn.logstore.driver import LogFencedError, LogStoreError


class KafkaLogError(LogStoreError):
    """Base class of Kafka log backend errors."""


class AppendFailedError(KafkaLogError):
    """A WAL record could not be made durable; its entries (and all later ones) are not acknowledged."""


class AppendTimeoutError(AppendFailedError):
    """No acknowledgement from the broker within `wal.append_timeout_s`; nothing was acknowledged."""


class WindowTimeoutError(KafkaLogError):
    """An append waited longer than the timeout for the LSN window to open."""


class FencedError(AppendFailedError, LogFencedError):
    """A newer writer epoch owns the WAL; this writer's later records are never replayed."""


class RetentionUnsafeError(KafkaLogError):
    """The WAL topic's retention could delete entries above the truncation point.

    `setting` names the topic config at fault (`retention.ms` or `retention.bytes`).
    """

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(message)
        self.setting = setting


class AcknowledgedEntryLostError(KafkaLogError):
    """Replay found a record whose header says entries were acknowledged that the log no longer holds."""


class ReplayTimeoutError(KafkaLogError):
    """Reading the WAL or meta topic up to its end marker took longer than the bound."""
