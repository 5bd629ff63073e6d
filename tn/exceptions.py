"""Errors the transaction node reports to its callers.

Every error carries a machine-readable `code` (what a `TxnResult` reports as
its abort reason) and a human-readable message (`str(err)`).
"""

from __future__ import annotations


class TnError(Exception):
    """Base class of transaction-node errors."""

    default_code = "error"

    def __init__(self, code: str | None = None, message: str = "") -> None:
        self.code: str = code or self.default_code
        self.message: str = message or self.code
        super().__init__(self.message)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class ValidationError(TnError):
    """The request is invalid against the catalog/snapshot; nothing was changed.

    Codes: unknown_database, unknown_table, bad_column, type_mismatch,
    missing_primary_key, duplicate_key, exists, oversized, bad_request.
    """

    default_code = "bad_request"


class ConflictError(TnError):
    """The transaction lost a conflict at commit: write_conflict (same primary key
    written by a transaction that committed after this one's StartTS) or
    ddl_conflict (the table/database was created, dropped or altered concurrently)."""

    default_code = "write_conflict"


class EngineClosedError(TnError):
    """The engine was closed (or has failed) and accepts no more work."""

    default_code = "engine_closed"


class LogFailedError(TnError):
    """The WAL append of this transaction, or of one queued before it, failed. This
    engine never makes the transaction visible and stops accepting commits; but its
    outcome is *unknown*, not aborted: its entry may have reached the log (a broker
    that wrote a record and lost the answer), and then recovery replays it. Reopen the
    log and `Engine.recover` to learn it (the TN service does, and answers only then)."""

    default_code = "log_failed"


class TxnClosedError(TnError):
    """The transaction was already committed or rolled back."""

    default_code = "txn_closed"
