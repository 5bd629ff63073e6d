"""The source's Kafka side against the real broker (no Spark): real ends despite a lagging
high watermark, exact range reads, bounded waits."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from consumers.spark.kafka_io import EndFinder, KafkaSourceError, read_range
from consumers.spark.offsets import OffsetRange
from consumers.spark.source import SOURCE_SCHEMA
from infra.processes import ServerProcess
from tests.conftest import TEST_BROKER, unique
from tests.spark.helpers import create_topic, produce
from tests.waiting import wait_until


def _arrow_schema() -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(SOURCE_SCHEMA, timezone="UTC")


def test_end_finder_finds_real_end_past_lagging_watermark(
    kafka_bootstrap: str, embedded_broker: ServerProcess | None
) -> None:
    topic = unique("src-end-")
    create_topic(kafka_bootstrap, topic, 2)
    produce(kafka_bootstrap, topic, 2, 0, 300, batches=3)  # 150 per partition, 3 batches
    finder = EndFinder({"bootstrap.servers": kafka_bootstrap}, timeout_s=5.0)
    try:
        keys = finder.partitions([topic])
        assert keys == [(topic, 0), (topic, 1)]
        wm = finder.watermarks(keys)
        assert all(high <= 150 for _low, high in wm.values())
        if embedded_broker is not None and TEST_BROKER == "tansu":  # its lagging watermark is real
            assert any(high < 150 for _low, high in wm.values()), wm
        assert finder.ends(keys, wm) == {(topic, 0): 150, (topic, 1): 150}
        probes = finder.probes
        # unchanged watermark: the confirmed end is reused, no probe
        assert finder.ends(keys) == {(topic, 0): 150, (topic, 1): 150}
        assert finder.probes == probes
        produce(kafka_bootstrap, topic, 2, 300, 20)
        assert finder.ends(keys) == {(topic, 0): 160, (topic, 1): 160}
        assert finder.partitions([unique("missing-")]) == []
    finally:
        finder.close()


def test_read_range_exact_and_bounded(kafka_bootstrap: str) -> None:
    topic = unique("src-read-")
    create_topic(kafka_bootstrap, topic, 1)
    produce(kafka_bootstrap, topic, 1, 0, 100, batches=4)
    conf = {"bootstrap.servers": kafka_bootstrap}
    schema = _arrow_schema()
    batches = list(read_range(conf, OffsetRange(topic, 0, 10, 100), schema, 5.0, chunk=30))
    assert all(b.schema.equals(schema) for b in batches)
    table = pa.Table.from_batches(batches)
    assert table.column("offset").to_pylist() == list(range(10, 100))
    assert table.column("key").to_pylist()[0] == b"k10"
    assert table.column("value").to_pylist()[-1] == b"v99"
    assert table.column("headers").to_pylist()[0] == [{"key": "h", "value": b"10"}]
    assert table.column("partition").to_pylist() == [0] * 90
    # a range past the end cannot be read: a clear error after the bounded wait
    t0 = time.monotonic()
    with pytest.raises(KafkaSourceError, match="no record arrived"):
        list(read_range(conf, OffsetRange(topic, 0, 100, 105), schema, 1.0))
    assert time.monotonic() - t0 < 5


def test_a_spark_partition_reads_its_ranges_in_turn(kafka_bootstrap: str) -> None:
    """A task's ranges (`plan_partitions`) are read one after the other, each exactly."""
    from consumers.spark.source import KafkaInputPartition, KwalKafkaBatchReader, SourceOptions

    a, b = unique("src-ranges-a-"), unique("src-ranges-b-")
    create_topic(kafka_bootstrap, a, 2)
    create_topic(kafka_bootstrap, b, 1)
    produce(kafka_bootstrap, a, 2, 0, 200, batches=2)  # 100 per partition
    produce(kafka_bootstrap, b, 1, 0, 50, batches=2)
    ranges = [
        OffsetRange(a, 0, 0, 30),  # the partition has 70 more records past this range
        OffsetRange(a, 1, 60, 100),
        OffsetRange(b, 0, 10, 50),
    ]
    opts = SourceOptions.parse({"bootstrap": kafka_bootstrap, "topics": f"{a},{b}"}, False)
    reader = KwalKafkaBatchReader(opts, SOURCE_SCHEMA)
    table = pa.Table.from_batches(list(reader.read(KafkaInputPartition(ranges))))
    got = list(
        zip(
            table.column("topic").to_pylist(),
            table.column("partition").to_pylist(),
            table.column("offset").to_pylist(),
            strict=True,
        )
    )
    assert got == [(r.topic, r.partition, o) for r in ranges for o in range(r.start, r.end)]


def test_stream_reader_pickles_without_kafka_clients(kafka_bootstrap: str) -> None:
    import pickle

    from consumers.spark.source import KwalKafkaStreamReader, SourceOptions

    topic = unique("src-pickle-")
    create_topic(kafka_bootstrap, topic, 1)
    opts = SourceOptions.parse({"bootstrap": kafka_bootstrap, "topics": topic}, streaming=True)
    reader = KwalKafkaStreamReader(opts, SOURCE_SCHEMA)
    assert reader.initialOffset() == {topic: {"0": 0}}
    assert reader._finder is not None  # the driver keeps its prober between micro-batches
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._finder is None and copy.options == opts
    reader.stop()
    assert reader._finder is None


def test_available_now_reads_up_to_the_ends_found_when_it_began(kafka_bootstrap: str) -> None:
    """The stream reader's offset planning as Spark drives an availableNow query: records
    written after `prepareForTriggerAvailableNow` are left for a later run, and the start
    offsets Spark asks for twice are one answer."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from consumers.spark.source import KwalKafkaStreamReader, SourceOptions

    topic = unique("src-target-")
    create_topic(kafka_bootstrap, topic, 2)
    produce(kafka_bootstrap, topic, 2, 0, 100, batches=2)  # 50 per partition
    opts = SourceOptions.parse(
        {"bootstrap": kafka_bootstrap, "topics": topic, "startingOffsets": "latest"}, True
    )
    reader = KwalKafkaStreamReader(opts, SOURCE_SCHEMA)
    try:
        reader.prepareForTriggerAvailableNow()
        produce(kafka_bootstrap, topic, 2, 100, 40)  # after the run began
        start = reader.initialOffset()
        assert start == {topic: {"0": 50, "1": 50}}  # latest, as it was when the run began
        assert reader.initialOffset() == start
        assert reader.latestOffset(start, ReadAllAvailable()) == start  # nothing before the target

        opts = SourceOptions.parse(
            {"bootstrap": kafka_bootstrap, "topics": topic, "startingOffsets": "earliest"}, True
        )
        early = KwalKafkaStreamReader(opts, SOURCE_SCHEMA)
        early.prepareForTriggerAvailableNow()
        produce(kafka_bootstrap, topic, 2, 140, 20)
        begin = early.initialOffset()
        assert begin == {topic: {"0": 0, "1": 0}}
        first = early.latestOffset(begin, ReadMaxRows(30))
        assert sum(first[topic].values()) == 30
        assert early.latestOffset(first, ReadAllAvailable()) == {topic: {"0": 70, "1": 70}}
        early.stop()
    finally:
        reader.stop()


@pytest.mark.parametrize("transactional", [False, True], ids=["plain", "transactions"])
def test_the_end_of_a_topic_written_without_pause_is_found_while_it_is_written(
    kafka_bootstrap: str, transactional: bool
) -> None:
    """A partition that gets a record more often than the probe's fetch wait (50 ms) never
    gives it an empty fetch, so never end-of-partition: its end is still found, once the
    probe's position reaches the high watermark of its own fetch, while the writer goes on
    (before, the probe read on until its bound: 10 s at every available-now start on a
    topic with 20 ms heartbeats). The end is at or past the watermark read before, and
    every offset below it exists. Also with one transaction per record, as the TN writes
    its topics: an end taken from the position counts the commit markers (there, a
    transaction's round trips can leave the fetch an empty moment, so end-of-partition
    may come first)."""
    topic = unique("src-busy-")
    create_topic(kafka_bootstrap, topic, 1)
    produce(kafka_bootstrap, topic, 1, 0, 50)
    stop = threading.Event()
    written = [50]  # offsets used: records, and a marker per transaction

    def write() -> None:
        conf = {"bootstrap.servers": kafka_bootstrap, "linger.ms": 0}
        if transactional:
            conf["transactional.id"] = topic
        p = Producer(conf)
        if transactional:
            p.init_transactions(30)
        until = time.monotonic() + 120  # a bound on a hang only: the test stops it first
        while not stop.is_set() and time.monotonic() < until:
            if transactional:
                p.begin_transaction()
                p.produce(topic, b"x")
                p.commit_transaction(30)
                written[0] += 2
            else:
                p.produce(topic, b"x")
                p.flush(10)
                written[0] += 1
            stop.wait(0.005)

    writer = threading.Thread(target=write, daemon=True)
    finder = EndFinder({"bootstrap.servers": kafka_bootstrap}, timeout_s=600.0, probe_s=600.0)
    writer.start()
    try:
        wait_until("the writer wrote", lambda: written[0] > 60)
        key = (topic, 0)
        wm = finder.watermarks([key])
        end = finder.ends([key], wm, probe_s=600.0)[key]
        assert writer.is_alive(), "the probe ended only when the writer stopped"
    finally:
        stop.set()
        writer.join(30)
        finder.close()
    assert wm[key][1] <= end <= written[0]
