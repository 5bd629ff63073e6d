"""The producers client on its own: row shapes, errors, timeouts."""

from __future__ import annotations

import pyarrow as pa
import pytest

from infra.config import KwalConfig
from infra.topics import ensure_topics
from producers import Client, TimeoutError, ValidationError
from producers.client import split_table, to_arrow
from producers.exceptions import ConflictError, ProducerError, error_for


def test_rows_shapes() -> None:
    dicts = to_arrow([{"id": 1, "v": "a"}, {"id": 2, "v": None}])
    lists = to_arrow([[1, "a"], (2, None)], columns=["id", "v"])
    table = to_arrow(pa.table({"id": [1, 2], "v": ["a", None]}))
    assert dicts.to_pylist() == lists.to_pylist() == table.to_pylist()
    with pytest.raises(ValueError):
        to_arrow([[1, "a"]])  # lists need column names
    with pytest.raises(ValueError):
        to_arrow([[1]], columns=["id", "v"])
    assert split_table("db.t") == ("db", "t")
    with pytest.raises(ValueError):
        split_table("nodot")


def test_error_mapping() -> None:
    e = error_for("conflict", "write_conflict", "lost", "r1")
    assert isinstance(e, ConflictError) and e.code == "write_conflict" and e.request_id == "r1"
    v = error_for("validation", "unknown_table", "no such table")
    assert isinstance(v, ValidationError) and isinstance(v, ProducerError)
    assert v.message == "no such table" and "unknown_table" in str(v)


def test_commit_times_out_without_a_tn(kwal_config: KwalConfig) -> None:
    ensure_topics(kwal_config)
    with Client(kwal_config) as client:
        txn = client.begin().insert("db.t", [{"id": 1}])
        with pytest.raises(TimeoutError) as info:
            txn.commit(timeout=1.0)
        assert info.value.code == "timeout" and info.value.request_id == txn.request_id
        with pytest.raises(ProducerError):
            txn.commit()  # a transaction is sent once
        with pytest.raises(ValidationError):
            client.begin().commit()  # empty
