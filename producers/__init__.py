"""The client library services use to send transactions to kwal and await results."""

from producers.client import Client, CommitResult, Transaction, new_request_id
from producers.exceptions import (
    AbortedError,
    ClientClosedError,
    ConflictError,
    PermissionDenied,
    ProducerError,
    TimeoutError,
    ValidationError,
)

__all__ = [
    "AbortedError",
    "Client",
    "ClientClosedError",
    "CommitResult",
    "ConflictError",
    "PermissionDenied",
    "ProducerError",
    "TimeoutError",
    "Transaction",
    "ValidationError",
    "new_request_id",
]
