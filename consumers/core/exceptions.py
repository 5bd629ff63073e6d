"""Errors a CN raises to its readers."""

from __future__ import annotations


class CNError(Exception):
    """Base class of CN errors."""


class TableNotFoundError(CNError, KeyError):
    """The table is not subscribed, or does not exist at the asked ts."""


class AboveWatermarkError(CNError):
    """A read at a ts the CN has not caught up to: it would not be consistent."""


class NotSubscribedError(TableNotFoundError):
    """The CN was not asked to follow this table."""


class BelowHorizonError(CNError):
    """A read at a ts older than the checkpoint this CN bootstrapped from: the
    objects hold the state as of that checkpoint, not the history before it."""


class BootstrapError(CNError):
    """The CN cannot (re)build its state from the object store's newest checkpoint."""


class SchemaMismatchError(CNError):
    """A table's records carry a column that no schema the catalog topic declared for the
    table has, at or before the records' ts: the producer and the catalog disagree."""


class TruncatedLogtailError(CNError):
    """A CN that builds its state from its topics' first records found one truncated (after
    a checkpoint, or by retention): starting there would miss the rows before the gap."""
