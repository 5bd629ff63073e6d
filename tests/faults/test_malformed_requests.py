"""Fault: a fuzzed stream of malformed requests. Each gets an aborted result with a
reason, the TN stays up, and committed data is unchanged."""

from __future__ import annotations

import uuid

import pyarrow as pa
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.config import KwalConfig
from producers import Client
from schemas.requests import OpKind, TxnOp, TxnRequest, encode_request
from tests.service.conftest import RunningTn, client, client_factory, tn  # noqa: F401 - fixtures
from tests.service.test_service import T, raw_results, rows_of, setup_table


def _valid(rows: pa.Table) -> bytes:
    return encode_request(TxnRequest(uuid.uuid4().hex, "fuzz", (TxnOp(OpKind.INSERT, "shop", "items", rows=rows),)))


payloads = st.one_of(
    st.binary(max_size=300),  # random bytes
    st.binary(min_size=4, max_size=200).map(lambda b: b"KW" + bytes([b[0] % 250 + 2]) + b[1:]),  # unknown versions
    st.integers(5, 120).map(lambda n: _valid(pa.table({"id": [7]}))[:n]),  # truncated
    # above tn.max_request_bytes (8 MiB), within what the requests topic takes (the TN's
    # limit plus framing): the broker accepts it and the TN must refuse it
    st.integers(1, 3).map(lambda k: _valid(pa.table({"id": [10**6 + k], "name": ["x" * ((8 << 20) + 1000 * k)]}))),
    st.sampled_from(["nosuch", "items2"]).map(  # a well-formed request for a table that is not there
        lambda t: encode_request(
            TxnRequest(uuid.uuid4().hex, "fuzz", (TxnOp(OpKind.INSERT, "shop", t, rows=pa.table({"id": [1]})),))
        )
    ),
)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(payloads, min_size=5, max_size=15))
def test_fuzzed_requests_all_abort_and_change_nothing(
    tn: RunningTn,  # noqa: F811
    client: Client,  # noqa: F811
    kwal_config: KwalConfig,
    batch: list[bytes],
) -> None:
    if "shop" not in tn.engine.tables():
        setup_table(client)
        client.begin().insert(T, [{"id": 1, "name": "keep", "price": 1.0}]).commit(timeout=30)
    before = rows_of(tn)
    already = len(raw_results(kwal_config, want=10**9, timeout=1.0))
    p = Producer(kwal_config.kafka_client(**{"message.max.bytes": kwal_config.max_record_bytes}))
    for value in batch:
        p.produce(kwal_config.topics.requests, key=b"fuzz", value=value)
    assert p.flush(30) == 0
    results = raw_results(kwal_config, want=already + len(batch), timeout=60)[already:]
    assert len(results) == len(batch)
    for _key, result in results:
        assert not result.committed, result
        assert result.reason, result
    assert rows_of(tn) == before
    # and the TN still commits
    assert client.begin().insert(T, [{"id": 2 + len(results), "name": "n", "price": 2.0}]).commit(timeout=30)
    client.begin().delete(T, [2 + len(results)]).commit(timeout=30)
