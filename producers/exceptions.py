"""Typed errors of the producers client. Every one carries `.code` (the TN's
reason code, or a client-side one) and `.message`."""

from __future__ import annotations

from typing import Any


class ProducerError(Exception):
    """Base class: a transaction did not commit (or its outcome is unknown)."""

    default_code = "error"

    def __init__(self, message: str, code: str | None = None, request_id: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.request_id = request_id

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class ConflictError(ProducerError):
    """Write-write conflict (snapshot isolation): another transaction committed
    a write to the same key after this one started. Safe to retry."""

    default_code = "conflict"


class ValidationError(ProducerError):
    """The TN rejected the request: unknown table, wrong types, missing primary
    key, oversized, undecodable, ... Retrying the same request will not help."""

    default_code = "validation"


class PermissionDenied(ProducerError):
    """Placeholder: kwal has no authorization yet; reserved for it."""

    default_code = "permission_denied"


class TimeoutError(ProducerError):  # noqa: A001 - deliberately the client's own TimeoutError
    """No result arrived in time. The outcome is UNKNOWN: the transaction may
    still commit. Re-sending the same request id is deduplicated by the TN."""

    default_code = "timeout"


class AbortedError(ProducerError):
    """Aborted for another reason (internal error, TN shutting down)."""

    default_code = "aborted"


class ClientClosedError(ProducerError):
    default_code = "client_closed"


def error_for(kind: str, code: str, message: str, request_id: str = "") -> ProducerError:
    cls: Any = {
        "conflict": ConflictError,
        "validation": ValidationError,
        "permission": PermissionDenied,
    }.get(kind, AbortedError)
    return cls(message, code=code or None, request_id=request_id)
