"""Errors of the record codec (`schemas.codec`) and Arrow IPC helpers (`schemas.arrow_ipc`).

Every error a reader can hit on foreign, newer or damaged bytes is a
`CodecError`, so a consumer can skip-and-report one record with a single
`except` without catching unrelated bugs.
"""

from __future__ import annotations


class CodecError(Exception):
    """Base class: these bytes could not be turned into a record, or back."""


class UnsupportedFormatError(CodecError):
    """Not a kwal record this reader understands: wrong magic, an unknown format
    version (written by a newer kwal) or an unknown schema name. Refused before
    any decoding, so such bytes are never mis-decoded."""


class UnexpectedSchemaError(UnsupportedFormatError):
    """A well-formed record of another schema than the caller expected
    (e.g. a `txn_request` where a `wal_entry` belongs). A kind of
    `UnsupportedFormatError`: either way this reader cannot use the bytes."""


class DecodeError(CodecError):
    """The envelope was understood but the body is truncated or garbled."""


class EncodeError(CodecError):
    """A record does not fit its schema (missing field, wrong type, out of range)."""
