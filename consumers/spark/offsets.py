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


MIN_SPLIT = 1000
"""Offsets below which a micro-batch is not cut into more Spark partitions just to use more
cores (`plan_partitions`): a Spark task took 0.2-0.3 s to start and finish on a 2-core
machine whatever it read (measured), more than decoding 1,000 logtail records takes
(~0.06 s of 10-row records)."""


def plan_partitions(
    start: Mapping[TopicPartitionKey, int],
    end: Mapping[TopicPartitionKey, int],
    max_per_partition: int,
    min_partitions: int = 1,
) -> list[list[OffsetRange]]:
    """The offset ranges of a micro-batch (or batch read), grouped into Spark partitions: one
    task each, which reads its ranges one after the other.

    1. one range per topic-partition with new records, in (topic, partition) order; a
       partition missing from `start` is read from offset 0;
    2. the number of Spark partitions: enough that none holds more than `max_per_partition`
       offsets, and at least `min_partitions` (the cores the job may use) as long as each
       still gets `MIN_SPLIT` offsets;
    3. the ranges, laid end to end, are cut into that many pieces whose sizes differ by at
       most one offset.

    So a small range (the catalog topic's few records, a quiet table's heartbeats) shares a
    task with others instead of costing a task of its own, and a large one is shared by
    the cores. A range cut in two keeps `from_new_partition` on its first piece only."""
    if max_per_partition <= 0 or min_partitions <= 0:
        raise ValueError("max_per_partition and min_partitions must be positive")
    ranges = [
        OffsetRange(key[0], key[1], start.get(key, 0), hi, key not in start)
        for key, hi in sorted(end.items())
        if hi > start.get(key, 0)
    ]
    total = sum(r.size for r in ranges)
    if total == 0:
        return []
    count = max(-(-total // max_per_partition), min(min_partitions, total // MIN_SPLIT), 1)
    size, extra = divmod(total, count)
    pieces: list[list[OffsetRange]] = []
    index, pos = 0, ranges[0].start
    for i in range(count):
        want = size + (1 if i < extra else 0)
        piece: list[OffsetRange] = []
        while want > 0:
            r = ranges[index]
            take = min(want, r.end - pos)
            piece.append(
                OffsetRange(r.topic, r.partition, pos, pos + take, r.from_new_partition and pos == r.start)
            )
            pos += take
            want -= take
            if pos == r.end and index + 1 < len(ranges):
                index += 1
                pos = ranges[index].start
        pieces.append(piece)
    return pieces


def parse_topics(text: str | Iterable[str] | None) -> list[str]:
    if text is None:
        return []
    items = text.split(",") if isinstance(text, str) else list(text)
    topics = sorted({t.strip() for t in items if t and t.strip()})
    return topics
