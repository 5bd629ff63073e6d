"""The logtail's Changes and Heartbeat records written and read by hand
(`schemas.logtail`): the same bytes as the codec's fastavro, the same values back,
the same errors; every other body still goes through the codec."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.codec import decode_record, encode_record
from schemas.exceptions import CodecError, EncodeError
from schemas.logtail import (
    LOGTAIL,
    BlockMeta,
    Catalog,
    CatalogOp,
    Changes,
    Checkpoint,
    Heartbeat,
    LogtailRecord,
    decode_logtail,
    encode_logtail,
    record_from_dict,
    record_to_dict,
)

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
TEXT = st.text(max_size=80)  # past 63 bytes a length takes two varint bytes
BLOB = st.one_of(st.none(), st.binary(max_size=200))

records = st.builds(
    LogtailRecord,
    database=TEXT,
    table=TEXT,
    commit_ts=INT64,
    body=st.one_of(st.builds(Changes, BLOB, BLOB), st.just(Heartbeat())),
    table_id=INT64,
    lsn=INT64,
)


def _codec(record: LogtailRecord) -> bytes:
    return encode_record(LOGTAIL, record_to_dict(record))


@settings(max_examples=400)
@given(records)
def test_changes_and_heartbeats_are_written_as_the_codec_writes_them_and_read_back(
    record: LogtailRecord,
) -> None:
    data = encode_logtail(record)
    assert data == _codec(record)
    assert decode_logtail(data) == record
    assert decode_record(data, expected=LOGTAIL)[1]["lsn"] == record.lsn


def test_the_other_bodies_still_go_through_the_codec() -> None:
    for body in (
        BlockMeta(7, "k.parquet", 5, "d.parquet", 2, 3),
        Checkpoint("manifests/1.json"),
        Catalog(CatalogOp.CREATE_DATABASE, 4),
    ):
        record = LogtailRecord("db", "t", 9, body, 3, 8)
        assert encode_logtail(record) == _codec(record)
        assert decode_logtail(encode_logtail(record)) == record


def _error(call: Callable[[], object]) -> tuple[type, str]:
    with pytest.raises(Exception) as info:
        call()
    return info.type, str(info.value)


def test_a_record_that_does_not_fit_the_schema_gets_the_codecs_error() -> None:
    for bad in (
        LogtailRecord("db", "t", 1 << 63, Heartbeat()),  # beyond a long
        LogtailRecord("db\ud800", "t", 1, Changes(b"x")),  # a lone surrogate is no UTF-8
        LogtailRecord(5, "t", 1, Heartbeat()),  # type: ignore[arg-type]
        LogtailRecord("db", "t", 1, Changes("text")),  # type: ignore[arg-type]
    ):
        got = _error(lambda bad=bad: encode_logtail(bad))
        assert got == _error(lambda bad=bad: _codec(bad))
        assert got[0] is EncodeError


@settings(max_examples=300)
@given(records, st.data())
def test_a_damaged_record_reads_as_the_codec_reads_it(record: LogtailRecord, data: st.DataObject) -> None:
    """Cut or with one byte changed: the hand-written reader answers what the codec
    answers (the same record, or the codec's error), never something else."""
    good = encode_logtail(record)
    at = data.draw(st.integers(0, len(good) - 1))
    damaged = data.draw(
        st.sampled_from(
            [good[:at], good[:at] + bytes([good[at] ^ data.draw(st.integers(1, 255))]) + good[at + 1 :]]
        )
    )
    try:
        expected: object = _read_by_codec(damaged)
    except CodecError as e:
        with pytest.raises(type(e)):
            decode_logtail(damaged)
        return
    assert decode_logtail(damaged) == expected


def _read_by_codec(data: bytes) -> LogtailRecord:
    return record_from_dict(decode_record(data, expected=LOGTAIL)[1])
