"""Errors of the checkpoint layer."""

from __future__ import annotations


class CheckpointError(Exception):
    """A checkpoint could not be taken or loaded."""


class InjectedCrash(CheckpointError):
    """Raised by a test hook between two checkpoint steps (simulated crash)."""


class LargeTxnError(CheckpointError):
    """A large transaction's object is missing, has the wrong schema or conflicts."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
