"""Pure offset helpers of the Spark source (no Kafka, no Spark)."""

from __future__ import annotations

import json

import pytest

from consumers.spark.offsets import (
    EARLIEST,
    LATEST,
    OffsetRange,
    OffsetSpecError,
    cap_by_limit,
    from_offset_dict,
    parse_offset_spec,
    parse_topics,
    split_ranges,
    to_offset_dict,
)


def test_offset_dict_round_trip_is_sorted_and_json_stable() -> None:
    offsets = {("b", 10): 5, ("a", 2): 7, ("b", 2): 1}
    d = to_offset_dict(offsets)
    assert json.dumps(d) == '{"a": {"2": 7}, "b": {"2": 1, "10": 5}}'
    assert from_offset_dict(json.loads(json.dumps(d))) == offsets


def test_parse_offset_spec() -> None:
    assert parse_offset_spec(None, "latest").default == LATEST
    assert parse_offset_spec("earliest", "latest").default == EARLIEST
    spec = parse_offset_spec('{"t": {"0": 23, "1": -2}}', "latest")
    assert spec.explicit == {("t", 0): 23, ("t", 1): EARLIEST}
    assert spec.resolve(("t", 0), 0, 100) == 23
    assert spec.resolve(("t", 1), 3, 100) == 3
    assert spec.resolve(("t", 2), 3, 100) == 100
    for bad in ("nonsense", '["t"]', '{"t": 3}', '{"t": {"0": -5}}'):
        with pytest.raises(OffsetSpecError):
            parse_offset_spec(bad, "latest")


def test_cap_by_limit_shares_budget_and_never_exceeds() -> None:
    start = {("t", 0): 0, ("t", 1): 100}
    avail = {("t", 0): 1000, ("t", 1): 200, ("t", 2): 0}
    assert cap_by_limit(start, avail, None) == {("t", 0): 1000, ("t", 1): 200, ("t", 2): 0}
    capped = cap_by_limit(start, avail, 110)
    got = sum(capped[k] - start.get(k, 0) for k in capped)
    assert got == 110
    assert capped[("t", 0)] == 100 and capped[("t", 1)] == 110
    one = cap_by_limit(start, avail, 1)
    assert sum(one[k] - start.get(k, 0) for k in one) == 1
    # ends never below start, even if the broker reports less
    assert cap_by_limit({("t", 0): 50}, {("t", 0): 10}, 5) == {("t", 0): 50}


def test_split_ranges() -> None:
    ranges = split_ranges({("t", 0): 10}, {("t", 0): 35, ("t", 1): 3}, 10)
    assert ranges == [
        OffsetRange("t", 0, 10, 20),
        OffsetRange("t", 0, 20, 30),
        OffsetRange("t", 0, 30, 35),
        OffsetRange("t", 1, 0, 3, from_new_partition=True),
    ]
    assert split_ranges({("t", 0): 5}, {("t", 0): 5}, 10) == []


def test_parse_topics() -> None:
    assert parse_topics(" b, a,,b ") == ["a", "b"]
    assert parse_topics(["x"]) == ["x"]
