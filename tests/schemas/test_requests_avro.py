"""The request and results records written and read by hand (`schemas.avro_binary`):
the same bytes as the codec's fastavro, the same values back, the same errors."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable

import pyarrow as pa
import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import requests as rq
from schemas.arrow_ipc import table_to_ipc
from schemas.avro_binary import long_bytes, read_long, read_str, str_bytes
from schemas.codec import decode_record, encode_record, schema_of
from schemas.exceptions import CodecError, EncodeError
from schemas.requests import (
    Column,
    Kind,
    OpKind,
    TxnOp,
    TxnRequest,
    TxnResult,
    decode_request,
    decode_results,
    encode_request,
    encode_result,
    encode_results,
    request_from_dict,
    request_to_dict,
    result_to_dict,
)

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
TEXT = st.text(max_size=80)  # past 63 bytes a length takes two varint bytes

_ROWS = pa.table({"id": pa.array([1, 2], pa.int64()), "v": pa.array(["é", None])})

ops = st.builds(
    TxnOp,
    kind=st.sampled_from(list(OpKind)),
    database=TEXT,
    table=TEXT,
    columns=st.lists(st.builds(Column, TEXT, TEXT), max_size=3).map(tuple),
    primary_key=TEXT,
    rows=st.sampled_from([None, _ROWS, _ROWS.slice(1)]),
    keys=st.one_of(st.none(), st.lists(st.integers(-5, 5), max_size=3).map(tuple)),
)
requests = st.builds(
    TxnRequest,
    request_id=TEXT,
    client_id=TEXT,
    ops=st.lists(ops, max_size=4).map(tuple),
    sent_at_ms=INT64,
)
results = st.builds(
    TxnResult,
    request_id=TEXT,
    status=st.sampled_from(list(rq.Status)),
    commit_ts=INT64,
    kind=st.sampled_from(list(Kind)),
    reason=TEXT,
    message=TEXT,
    client_id=TEXT,
    request_offset=INT64,
)


def _fastavro(schema: str, value: object) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(schema), value)
    return out.getvalue()


@settings(max_examples=300)
@given(INT64)
def test_a_long_is_fastavros_and_reads_back(n: int) -> None:
    assert long_bytes(n) == _fastavro("long", n)
    assert read_long(long_bytes(n) + b"rest", 0) == (n, len(long_bytes(n)))


@settings(max_examples=300)
@given(TEXT)
def test_a_string_is_fastavros_and_reads_back(s: str) -> None:
    assert str_bytes(s) == _fastavro("string", s)
    assert read_str(str_bytes(s) + b"rest", 0) == (s, len(str_bytes(s)))


def test_a_long_beyond_int64_is_refused() -> None:
    with pytest.raises(OverflowError):
        long_bytes(1 << 63)
    with pytest.raises(ValueError):
        read_long(b"\xff" * 11, 0)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(requests)
def test_a_request_is_written_as_the_codec_writes_it_and_reads_back(req: TxnRequest) -> None:
    data = encode_request(req)
    assert data == encode_record(rq.REQUEST_SCHEMA, request_to_dict(req))
    back = decode_request(data)
    assert back.request_id == req.request_id and back.sent_at_ms == req.sent_at_ms
    assert [(o.kind, o.database, o.table, o.columns, o.primary_key, o.keys) for o in back.ops] == [
        (o.kind, o.database, o.table, o.columns, o.primary_key, o.keys) for o in req.ops
    ]
    assert [o.rows.to_pylist() if o.rows is not None else None for o in back.ops] == [
        o.rows.to_pylist() if o.rows is not None else None for o in req.ops
    ]


def _error(call: Callable[[], object]) -> tuple[type, str]:
    with pytest.raises(Exception) as info:
        call()
    return info.type, str(info.value)


def test_a_request_that_does_not_fit_the_schema_gets_the_codecs_error() -> None:
    op = TxnOp(OpKind.INSERT, "db", "t")
    for bad in (
        TxnRequest("r", "c", (op,), sent_at_ms=1 << 63),  # beyond a long
        TxnRequest("r", "c", (TxnOp(OpKind.INSERT, 5),)),  # type: ignore[arg-type]
        TxnRequest("r\ud800", "c", (op,)),  # a lone surrogate is no UTF-8
        TxnRequest("r", "c", (TxnOp("NOT_A_KIND", "db"),)),  # type: ignore[arg-type]
    ):
        got = _error(lambda bad=bad: encode_request(bad))
        assert got == _error(
            lambda bad=bad: encode_record(rq.REQUEST_SCHEMA, request_to_dict(bad))
        )
        assert got[0] in (EncodeError, AttributeError)


def test_a_request_naming_objects_is_still_v2() -> None:
    req = TxnRequest("r", "c", (TxnOp(OpKind.INSERT, "db", "t", objects=("k1",)),))
    assert decode_record(encode_request(req))[0] == rq.REQUEST_SCHEMA_V2
    assert decode_request(encode_request(req)).ops[0].objects == ("k1",)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(results, max_size=5))
def test_results_read_by_hand_equal_the_codecs_reading(batch: list[TxnResult]) -> None:
    data = encode_results(batch)
    assert decode_results(data) == batch == rq._results(data)
    for r in batch:
        assert decode_results(encode_result(r)) == [r] == rq._results(encode_result(r))


def test_an_unknown_kind_reads_as_internal_both_ways() -> None:
    d = {**result_to_dict(TxnResult.aborted("r", Kind.CONFLICT, "x", "m")), "kind": "newer"}
    for data in (
        encode_record(rq.RESULT_SCHEMA, d),
        encode_record(rq.RESULT_BATCH_SCHEMA, {"results": [d, d]}),
    ):
        assert rq._results(data) is not None
        assert [r.kind for r in decode_results(data)] == [Kind.INTERNAL] * len(rq._results(data) or ())


def test_garbled_results_are_refused_with_the_codecs_errors() -> None:
    good = encode_results([TxnResult.ok("req-1", 123456789, client_id="c", request_offset=4)] * 2)
    for bad in (
        good[:-1],  # truncated
        good + b"\x00",  # trailing bytes
        good[: len(good) // 2],
        good.replace(b"req-1", b"req-\xff"),  # not UTF-8
        encode_result(TxnResult.ok("r", 1))[:-3] + b"\x04\x00\x01",  # status index 2
    ):
        assert rq._results(bad) is None
        with pytest.raises(CodecError):
            decode_results(bad)


def test_a_block_with_a_byte_size_reads_too() -> None:
    """Avro lets a writer give a block's count negated, then its size in bytes."""
    r = TxnResult.ok("a", 7, client_id="c", request_offset=3)
    one = encode_result(r)[len(rq._RESULT_PREFIX) :]
    data = rq._RESULT_BATCH_PREFIX + long_bytes(-2) + long_bytes(2 * len(one)) + one + one + b"\x00"
    assert decode_results(data) == [r, r] == rq._results(data)


# ---- the TN's side: requests read, results written by hand ----------------------------


def _by_codec(data: bytes) -> TxnRequest:
    """`decode_request` as it was before the reader by hand: fastavro, then the dict."""
    if schema_of(data) not in rq.REQUEST_SCHEMAS:
        decode_record(data, rq.REQUEST_SCHEMA)
    return request_from_dict(decode_record(data)[1])


def _outcome(call: Callable[[], object]) -> object:
    """What a call returns, or the type and message of what it raises."""
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - compared, not handled
        return type(e), str(e)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(requests)
def test_a_request_read_by_hand_equals_the_codecs_reading(req: TxnRequest) -> None:
    data = encode_request(req)
    by_hand = rq._read_request_v1(data)
    assert by_hand is not None
    assert by_hand == _by_codec(data) == decode_request(data)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(requests, st.data())
def test_a_damaged_request_reads_or_fails_as_the_codec_says(req: TxnRequest, data: st.DataObject) -> None:
    """Any byte changed, or the record cut or extended: `decode_request` returns what
    the codec's reading returns, or raises the same error with the same message."""
    good = encode_request(req)
    at = data.draw(st.integers(len(rq._REQUEST_V1_PREFIX), len(good)))
    how = data.draw(st.sampled_from(["set", "cut", "extend"]))
    if how == "set" and at < len(good):
        bad = good[:at] + bytes([data.draw(st.integers(0, 255))]) + good[at + 1 :]
    elif how == "cut":
        bad = good[:at]
    else:
        bad = good[:at] + data.draw(st.binary(min_size=1, max_size=3)) + good[at:]
    assert _outcome(lambda: decode_request(bad)) == _outcome(lambda: _by_codec(bad))


def test_damaged_requests_are_refused_with_the_codecs_errors() -> None:
    op = TxnOp(OpKind.INSERT, "db", "t", rows=_ROWS)
    good = encode_request(TxnRequest("req-1", "c", (op,), sent_at_ms=5))
    rows_at = good.index(table_to_ipc(_ROWS))
    for bad in (
        good[:-1],  # truncated
        good + b"\x00",  # trailing bytes
        good.replace(b"req-1", b"req-\xff"),  # not UTF-8
        good[: rows_at - 3] + b"\x04" + good[rows_at - 2 :],  # the union's branch 2
        good[:rows_at] + b"not arrow" + good[rows_at + 9 :],  # rows that are not Arrow IPC
    ):
        assert _outcome(lambda bad=bad: decode_request(bad)) == _outcome(lambda bad=bad: _by_codec(bad))
        with pytest.raises((CodecError, rq.RequestFormatError)):
            decode_request(bad)
    assert rq._read_request_v1(good[:-1]) is None


def test_a_request_op_kind_past_the_symbols_is_the_codecs_error() -> None:
    good = encode_request(TxnRequest("r", "c", (TxnOp(OpKind.DELETE, "db", "t"),)))
    kind_at = len(rq._REQUEST_V1_PREFIX) + len(str_bytes("r")) + len(str_bytes("c")) + 2
    assert good[kind_at] == long_bytes(list(OpKind).index(OpKind.DELETE))[0]
    bad = good[:kind_at] + long_bytes(9) + good[kind_at + 1 :]
    assert rq._read_request_v1(bad) is None
    with pytest.raises(CodecError):
        decode_request(bad)


def test_request_blocks_with_a_byte_size_read_too() -> None:
    """Avro lets a writer give a block's count negated, then its size in bytes: the ops
    array and an op's columns."""
    req = TxnRequest("r", "c", (TxnOp(OpKind.CREATE_TABLE, "db", "t", (Column("a", "int64"),), "a"),))
    body = encode_request(req)[len(rq._REQUEST_V1_PREFIX) :]
    head = str_bytes("r") + str_bytes("c") + long_bytes(0)
    assert body.startswith(head + long_bytes(1))
    op = body[len(head) + 1 : -1]
    col = str_bytes("a") + str_bytes("int64")
    op_sized = op.replace(long_bytes(1) + col, long_bytes(-1) + long_bytes(len(col)) + col)
    data = rq._REQUEST_V1_PREFIX + head + long_bytes(-1) + long_bytes(len(op_sized)) + op_sized + b"\x00"
    assert rq._read_request_v1(data) == _by_codec(data) == req


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(results, max_size=5))
def test_results_are_written_as_the_codec_writes_them(batch: list[TxnResult]) -> None:
    assert encode_results(batch) == encode_record(
        rq.RESULT_BATCH_SCHEMA, {"results": [result_to_dict(r) for r in batch]}
    )
    for r in batch:
        assert encode_result(r) == encode_record(rq.RESULT_SCHEMA, result_to_dict(r))


def test_a_result_that_does_not_fit_the_schema_is_what_the_codec_makes_of_it() -> None:
    """The codec's error, or (a float or a bool for a long, which fastavro writes as an
    int) the codec's bytes."""
    ok = TxnResult.ok("r", 1, client_id="c", request_offset=2)
    for bad in (
        dataclasses.replace(ok, commit_ts=1 << 63),  # beyond a long
        dataclasses.replace(ok, reason=None),  # type: ignore[arg-type]
        dataclasses.replace(ok, message=b""),  # type: ignore[arg-type]
        dataclasses.replace(ok, request_id="r\ud800"),  # a lone surrogate is no UTF-8
        dataclasses.replace(ok, status="COMMITTED"),  # type: ignore[arg-type]
        dataclasses.replace(ok, commit_ts=1.5),  # type: ignore[arg-type]
        dataclasses.replace(ok, request_offset=True),
    ):
        got = _outcome(lambda bad=bad: encode_result(bad))
        assert got == _outcome(lambda bad=bad: encode_record(rq.RESULT_SCHEMA, result_to_dict(bad)))
        batch = _outcome(lambda bad=bad: encode_results([ok, bad]))
        assert batch == _outcome(
            lambda bad=bad: encode_record(
                rq.RESULT_BATCH_SCHEMA, {"results": [result_to_dict(ok), result_to_dict(bad)]}
            )
        )
    assert isinstance(_outcome(lambda: encode_result(dataclasses.replace(ok, reason=None))), tuple)
