"""Truncated ranges (records deleted below the query's offset). The embedded broker cannot
delete records (DeleteRecords breaks its connection, retention is not enforced), so the
consumer is replaced by a fake that behaves like Kafka after a truncation."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError

import consumers.spark.kafka_io as kafka_io
from consumers.spark.kafka_io import DataLossError, read_range
from consumers.spark.offsets import OffsetRange
from consumers.spark.source import SOURCE_SCHEMA


class FakeMessage:
    def __init__(self, offset: int, error: KafkaError | None = None) -> None:
        self._offset, self._error = offset, error

    def error(self) -> KafkaError | None:
        return self._error

    def offset(self) -> int:
        return self._offset

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def key(self) -> bytes:
        return b"k%d" % self._offset

    def value(self) -> bytes:
        return b"v%d" % self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

    def headers(self) -> None:
        return None


class TruncatedConsumer:
    """A partition whose log now starts at `low` and ends at `high`; a fetch below `low`
    fails like Kafka with auto.offset.reset=error (or, if `silent`, skips ahead)."""

    low, high, silent = 5, 10, False

    def __init__(self, conf: dict[str, Any]) -> None:
        self.pos = 0

    def assign(self, tps: list[Any]) -> None:
        self.pos = tps[0].offset

    def consume(self, n: int, timeout: float) -> list[FakeMessage]:
        if self.pos < self.low and not self.silent:
            return [FakeMessage(self.pos, KafkaError(KafkaError._AUTO_OFFSET_RESET))]
        start = max(self.pos, self.low)
        out = [FakeMessage(o) for o in range(start, min(self.high, start + n))]
        self.pos = start + len(out)
        return out

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        return self.low, self.high

    def position(self, tps: list[Any]) -> list[Any]:
        return []

    def close(self) -> None:
        pass


def _schema() -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(SOURCE_SCHEMA, timezone="UTC")


@pytest.mark.parametrize("silent", [False, True])
def test_truncated_range_fails_clearly_or_skips(
    monkeypatch: pytest.MonkeyPatch, silent: bool
) -> None:
    monkeypatch.setattr(TruncatedConsumer, "silent", silent)
    monkeypatch.setattr(kafka_io, "Consumer", TruncatedConsumer)
    conf = {"bootstrap.servers": "unused:1"}
    with pytest.raises(DataLossError, match="deleted"):
        list(read_range(conf, OffsetRange("t", 0, 2, 10), _schema(), 1.0))
    batches = list(
        read_range(conf, OffsetRange("t", 0, 2, 10), _schema(), 1.0, fail_on_data_loss=False)
    )
    assert pa.Table.from_batches(batches).column("offset").to_pylist() == [5, 6, 7, 8, 9]
    # a partition that appeared mid-query starts at 0 by design: its log start is no loss
    new = OffsetRange("t", 0, 0, 10, from_new_partition=True)
    batches = list(read_range(conf, new, _schema(), 1.0))
    assert pa.Table.from_batches(batches).column("offset").to_pylist() == [5, 6, 7, 8, 9]
