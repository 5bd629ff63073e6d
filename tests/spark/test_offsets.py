"""Pure offset helpers of the Spark source (no Kafka, no Spark)."""

from __future__ import annotations

import json

import pytest

from consumers.spark.offsets import (
    EARLIEST,
    LATEST,
    MIN_SPLIT,
    OffsetRange,
    OffsetSpecError,
    cap_by_limit,
    from_offset_dict,
    parse_offset_spec,
    parse_topics,
    plan_partitions,
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


def _sizes(pieces: list[list[OffsetRange]]) -> list[int]:
    return [sum(r.size for r in piece) for piece in pieces]


def _covered(pieces: list[list[OffsetRange]]) -> list[tuple[str, int, int]]:
    """Every (topic, partition, offset) the pieces read, in order."""
    return [(r.topic, r.partition, o) for piece in pieces for r in piece for o in range(r.start, r.end)]


def test_plan_partitions_cuts_at_most_max_per_partition_evenly() -> None:
    pieces = plan_partitions({("t", 0): 10}, {("t", 0): 35, ("t", 1): 3}, 10)
    # 28 offsets, at most 10 a piece: 3 pieces of 10, 9, 9, cut across the two partitions
    assert pieces == [
        [OffsetRange("t", 0, 10, 20)],
        [OffsetRange("t", 0, 20, 29)],
        [OffsetRange("t", 0, 29, 35), OffsetRange("t", 1, 0, 3, from_new_partition=True)],
    ]
    assert plan_partitions({("t", 0): 5}, {("t", 0): 5}, 10) == []
    # a new partition cut in two: only its first piece may begin past its start
    new = plan_partitions({}, {("n", 0): 30}, 10)
    assert [r.from_new_partition for piece in new for r in piece] == [True, False, False]


def test_plan_partitions_packs_small_ranges_into_one_task() -> None:
    end = {("catalog", 0): 2, ("a", 0): 5, ("b", 0): 40}
    pieces = plan_partitions({("catalog", 0): 0, ("a", 0): 0, ("b", 0): 0}, end, 200000, 2)
    assert len(pieces) == 1  # 47 offsets: one task, not three (and not split for two cores)
    assert _covered(pieces) == _covered([[OffsetRange(t, 0, 0, e)] for (t, _), e in sorted(end.items())])


def test_plan_partitions_uses_min_partitions_once_each_gets_min_split() -> None:
    start = {("catalog", 0): 0, ("t", 0): 0}
    end = {("catalog", 0): 2, ("t", 0): 20000}
    pieces = plan_partitions(start, end, 50000, 2)
    assert _sizes(pieces) == [10001, 10001]
    assert pieces[0] == [OffsetRange("catalog", 0, 0, 2), OffsetRange("t", 0, 0, 9999)]
    assert pieces[1] == [OffsetRange("t", 0, 9999, 20000)]
    # fewer than MIN_SPLIT offsets per task: not split for the cores
    small = {("catalog", 0): 2, ("t", 0): 2 * MIN_SPLIT - 10}
    assert len(plan_partitions(start, small, 50000, 2)) == 1
    # max_per_partition still bounds every piece when it asks for more pieces than the cores
    many = plan_partitions(start, end, 3000, 2)
    assert len(many) == 7 and max(_sizes(many)) <= 3000
    assert _covered(many) == _covered(pieces)
    with pytest.raises(ValueError):
        plan_partitions(start, end, 0)
    with pytest.raises(ValueError):
        plan_partitions(start, end, 10, 0)


def test_parse_topics() -> None:
    assert parse_topics(" b, a,,b ") == ["a", "b"]
    assert parse_topics(["x"]) == ["x"]
