"""Offsets of the kwal Kafka source: pure helpers, no Kafka client, no Spark session.

An offset is a JSON-serialisable dict ``{topic: {"<partition>": next_offset}}``: for each
topic-partition, the Kafka offset of the next record to read (exclusive end of what was
read). Topics and partitions are always emitted in sorted order, so that two equal offsets
serialise to the same JSON text (Spark compares offsets by their JSON form).

``startingOffsets`` / ``endingOffsets`` take ``earliest``, ``latest`` or JSON in the built-in
Kafka source's form: ``{"topic": {"0": 23, "1": -2}}`` where -2 means earliest and -1 latest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

TopicPartitionKey = tuple[str, int]
EARLIEST = -2
LATEST = -1


class OffsetSpecError(ValueError):
    """A startingOffsets/endingOffsets option cannot be parsed."""


def to_offset_dict(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """{(topic, partition): offset} -> the sorted, JSON-serialisable offset dict."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), off in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(off)
    return out


def from_offset_dict(
    offsets: Mapping[str, Mapping[str, int]] | None,
) -> dict[TopicPartitionKey, int]:
    """The offset dict (as Spark hands it back, from JSON) -> {(topic, partition): offset}."""
    out: dict[TopicPartitionKey, int] = {}
    for topic, parts in (offsets or {}).items():
        for partition, off in parts.items():
            out[(topic, int(partition))] = int(off)
    return out


@dataclass(frozen=True)
class OffsetSpec:
    """A parsed startingOffsets/endingOffsets option.

    `default` (EARLIEST or LATEST) applies to partitions not listed in `explicit`."""

    default: int
    explicit: dict[TopicPartitionKey, int]

    def resolve(
        self,
        key: TopicPartitionKey,
        earliest: int,
        latest: int,
    ) -> int:
        value = self.explicit.get(key, self.default)
        if value == EARLIEST:
            return earliest
        if value == LATEST:
            return latest
        return value


def parse_offset_spec(text: str | None, default: str) -> OffsetSpec:
    """Parse ``earliest`` / ``latest`` / JSON. Partitions missing from JSON take `default`."""
    base = _named(default)
    if text is None or not text.strip():
        return OffsetSpec(base, {})
    stripped = text.strip()
    if stripped.lower() in ("earliest", "latest"):
        return OffsetSpec(_named(stripped), {})
    try:
        data = json.loads(stripped)
    except json.JSONDecodeError as e:
        raise OffsetSpecError(
            f"offsets must be 'earliest', 'latest' or JSON like "
            f'{{"topic": {{"0": 23, "1": -2}}}}; got {text!r}: {e}'
        ) from e
    if not isinstance(data, dict):
        raise OffsetSpecError(f"offsets JSON must be an object of topics, got {text!r}")
    explicit: dict[TopicPartitionKey, int] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise OffsetSpecError(f"offsets for topic {topic!r} must be an object, got {parts!r}")
        for partition, off in parts.items():
            try:
                p, o = int(partition), int(off)
            except (TypeError, ValueError) as e:
                raise OffsetSpecError(f"bad offset {topic}[{partition}]={off!r}") from e
            if o < EARLIEST:
                raise OffsetSpecError(
                    f"bad offset {topic}[{partition}]={o} (-2 earliest, -1 latest)"
                )
            explicit[(str(topic), p)] = o
    return OffsetSpec(base, explicit)


def _named(name: str) -> int:
    lowered = name.strip().lower()
    if lowered == "earliest":
        return EARLIEST
    if lowered == "latest":
        return LATEST
    raise OffsetSpecError(f"expected 'earliest' or 'latest', got {name!r}")


def cap_by_limit(
    start: Mapping[TopicPartitionKey, int],
    available: Mapping[TopicPartitionKey, int],
    max_records: int | None,
) -> dict[TopicPartitionKey, int]:
    """End offsets that admit at most `max_records` records in total (None: all available).

    The budget is shared in proportion to each partition's backlog (like the built-in
    source's maxOffsetsPerTrigger); the rounding remainder goes to the largest backlogs, so
    every call with a backlog admits at least one record and at most `max_records`.
    Partitions missing from `start` start at 0. Ends never go below their start."""
    begin = {k: start.get(k, 0) for k in available}
    lag = {k: max(0, available[k] - begin[k]) for k in available}
    total = sum(lag.values())
    if max_records is None or total <= max_records:
        return {k: begin[k] + lag[k] for k in available}
    if max_records <= 0:
        return dict(begin)
    share = {k: (lag[k] * max_records) // total for k in available}
    remainder = max_records - sum(share.values())
    for k in sorted(available, key=lambda k: (-(lag[k] - share[k]), k)):
        if remainder <= 0:
            break
        if share[k] < lag[k]:
            share[k] += 1
            remainder -= 1
    return {k: begin[k] + share[k] for k in available}


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int  # exclusive
    from_new_partition: bool = False  # not in the start offset: may begin past 0

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def split_ranges(
    start: Mapping[TopicPartitionKey, int],
    end: Mapping[TopicPartitionKey, int],
    max_per_range: int,
) -> list[OffsetRange]:
    """One range per topic-partition with new records, cut into pieces of at most
    `max_per_range` offsets. A partition missing from `start` is read from offset 0."""
    if max_per_range <= 0:
        raise ValueError("max_per_range must be positive")
    ranges: list[OffsetRange] = []
    for key in sorted(end):
        topic, partition = key
        is_new = key not in start
        lo = start.get(key, 0)
        hi = end[key]
        first = True
        while lo < hi:
            step = min(hi, lo + max_per_range)
            ranges.append(OffsetRange(topic, partition, lo, step, is_new and first))
            lo = step
            first = False
    return ranges


def parse_topics(text: str | Iterable[str] | None) -> list[str]:
    if text is None:
        return []
    items = text.split(",") if isinstance(text, str) else list(text)
    topics = sorted({t.strip() for t in items if t and t.strip()})
    return topics
