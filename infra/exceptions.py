"""Errors of the ground that reach an operator: each message is the one line to print."""

from __future__ import annotations


class OpsError(RuntimeError):
    """An ops command cannot do its work; the message is the one line to print."""


class KafkaUnreachableError(OpsError):
    pass
