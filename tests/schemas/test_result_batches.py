"""The results topic's two record forms: one `txn_result`, or a client's `txn_result_batch`."""

from __future__ import annotations

import pytest

from schemas.codec import schema_of
from schemas.exceptions import CodecError
from schemas.requests import (
    RESULT_BATCH_SCHEMA,
    RESULT_SCHEMA,
    Kind,
    TxnRequest,
    TxnResult,
    decode_results,
    encode_request,
    encode_result,
    encode_results,
)


def test_a_batch_round_trips_in_order_and_a_single_result_reads_as_a_list_of_one() -> None:
    results = [
        TxnResult.ok("a", 7, client_id="c", request_offset=3),
        TxnResult.aborted("b", Kind.CONFLICT, "write_conflict", "key 1", client_id="c"),
        TxnResult.ok("c", 9, client_id="c", request_offset=5),
    ]
    batch = encode_results(results)
    assert schema_of(batch) == RESULT_BATCH_SCHEMA
    assert decode_results(batch) == results
    single = encode_result(results[1])
    assert schema_of(single) == RESULT_SCHEMA
    assert decode_results(single) == [results[1]]


def test_a_record_of_another_kind_is_refused_naming_what_was_expected() -> None:
    other = encode_request(TxnRequest("r", "c"))
    with pytest.raises(CodecError, match="txn_result"):
        decode_results(other)
