"""A Structured Streaming (and batch) source over Kafka, built on PySpark's Python Data
Source API with confluent-kafka inside; yields raw Kafka records.

    from consumers.spark.source import register, kafka_stream
    register(spark)                                   # once per session
    df = (spark.readStream.format("kwal-kafka")
          .option("bootstrap", "127.0.0.1:9092").option("topics", "a,b")
          .option("maxRecordsPerTrigger", 10000).load())
    df = kafka_stream(spark, "127.0.0.1:9092", ["a", "b"])   # or the built-in source

Options (names are case-insensitive):

| option | default | meaning |
|---|---|---|
| `bootstrap` | (required) | `bootstrap.servers`; `kafka.bootstrap.servers` also works |
| `kafka.<property>` | | passed to confluent-kafka untouched (SASL, TLS, `fetch.wait.max.ms`, ...) |
| `topics` | (required) | comma-separated topic names (`subscribe` is an alias) |
| `startingOffsets` | stream `latest`, batch `earliest` | `earliest`, `latest` or JSON `{"t": {"0": 23, "1": -2}}` (-2 earliest, -1 latest) |
| `endingOffsets` | `latest` | batch reads only; same forms |
| `maxRecordsPerTrigger` | none | at most this many records per micro-batch (alias `maxOffsetsPerTrigger`) |
| `maxRecordsPerPartition` | 200000 | at most this many offsets in one Spark partition (one task) |
| `minPartitions` | 1 | at least this many Spark partitions (the cores to use) while each gets 1,000 offsets or more |
| `pollTimeoutMs` | 10000 | bound of every wait: metadata, watermarks, and "no progress" while reading a range |
| `probeTimeoutMs` | 1000 | bound of one micro-batch's search for the real end of partitions (see `kafka_io`) |
| `failOnDataLoss` | true | fail when records of a planned range were deleted; false skips them |
| `decode` | none | a decoding plan (`consumers.spark.decode.DecodePlan.to_json`): yield decoded change rows, not raw records |

Schema (the built-in Kafka source's, with `includeHeaders=true`):
`key binary, value binary, topic string, partition int, offset long, timestamp timestamp,
timestampType int, headers array<struct<key: string, value: binary>>`.

With `decode`, the schema is the plan's wide change-row schema
(`consumers.spark.decode.wide_ddl`) and each record is decoded where it is read
(`decode_all`), in the source's own Python worker: the CN job then needs no `mapInArrow`
pass. The job's default is nevertheless Spark's built-in source (`--source`,
docs/perf-spark.md): a Python streaming source costs a fresh Python process per query for
its offset planning, more than the `mapInArrow` crossing the built-in one needs.

Offsets are ``{topic: {"<partition>": next_offset}}`` (see `consumers.spark.offsets`).
Partitions added to a topic while the query runs are read from their beginning.

Python workers must import this module (it is part of the installed `kwal` package) and
run the interpreter that has pyarrow and confluent-kafka: set `PYSPARK_PYTHON` to it
before the session starts (`consumers.spark.session.worker_python_env()` does so for the current interpreter).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from consumers.spark.arguments import DEFAULT_SOURCE, SOURCES
from consumers.spark.kafka_io import EndFinder, KafkaSourceError, read_range
from consumers.spark.offsets import (
    OffsetRange,
    OffsetSpec,
    TopicPartitionKey,
    cap_by_limit,
    from_offset_dict,
    parse_offset_spec,
    parse_topics,
    plan_partitions,
    to_offset_dict,
)

if TYPE_CHECKING:
    from consumers.spark.decode import DecodePlan

# `consumers.spark.decode` (pyarrow.compute, the Avro codecs) is imported only where records
# are decoded or the decoded schema is built. Spark starts the stream reader's offset
# planning in a fresh Python process for every query (`python_streaming_source_runner`),
# which never decodes. Measured: its imports took 0.62-0.74 s with the decoder and
# 0.40-0.51 s without (three runs each; `-X importtime` put the decoder at 0.16 s).

log = logging.getLogger(__name__)

SOURCE_NAME = "kwal-kafka"
BUILTIN_PROVIDER_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"

HEADER_TYPE = StructType(
    [StructField("key", StringType(), True), StructField("value", BinaryType(), True)]
)
SOURCE_SCHEMA = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("timestampType", IntegerType(), True),
        StructField("headers", ArrayType(HEADER_TYPE, True), True),
    ]
)


@dataclass(frozen=True)
class SourceOptions:
    kafka: dict[str, str]
    topics: list[str]
    starting: OffsetSpec
    ending: OffsetSpec
    max_records_per_trigger: int | None
    max_records_per_partition: int
    min_partitions: int
    poll_timeout_s: float
    probe_timeout_s: float
    fail_on_data_loss: bool
    decode: str | None = None  # a DecodePlan.to_json text

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool) -> SourceOptions:
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        kafka = {k[len("kafka.") :]: v for k, v in opts.items() if k.startswith("kafka.")}
        if "bootstrap" in opts:
            kafka["bootstrap.servers"] = opts["bootstrap"]
        if not kafka.get("bootstrap.servers"):
            raise KafkaSourceError(f"{SOURCE_NAME}: the 'bootstrap' option is required")
        topics = parse_topics(opts.get("topics") or opts.get("subscribe"))
        if not topics:
            raise KafkaSourceError(f"{SOURCE_NAME}: the 'topics' option (comma list) is required")
        limit_text = opts.get("maxrecordspertrigger") or opts.get("maxoffsetspertrigger")
        limit = _positive_int(limit_text, "maxRecordsPerTrigger") if limit_text else None
        return cls(
            kafka=kafka,
            topics=topics,
            starting=parse_offset_spec(
                opts.get("startingoffsets"), "latest" if streaming else "earliest"
            ),
            ending=parse_offset_spec(opts.get("endingoffsets"), "latest"),
            max_records_per_trigger=limit,
            max_records_per_partition=_positive_int(
                opts.get("maxrecordsperpartition", "200000"), "maxRecordsPerPartition"
            ),
            min_partitions=_positive_int(opts.get("minpartitions", "1"), "minPartitions"),
            poll_timeout_s=_positive_int(opts.get("polltimeoutms", "10000"), "pollTimeoutMs")
            / 1000.0,
            probe_timeout_s=_positive_int(opts.get("probetimeoutms", "1000"), "probeTimeoutMs")
            / 1000.0,
            fail_on_data_loss=opts.get("failondataloss", "true").lower() != "false",
            decode=opts.get("decode"),
        )


def decode_plan(text: str | None) -> DecodePlan | None:
    """The `decode` option's plan. Checked where it is used (the schema, on the driver when
    the DataFrame is loaded; the reads, on the executors), not by `SourceOptions.parse`:
    see the note on imports above."""
    if text is None:
        return None
    from consumers.spark.decode import DecodePlan

    try:
        return DecodePlan.from_json(text)
    except (ValueError, KeyError, TypeError) as e:
        raise KafkaSourceError(f"{SOURCE_NAME}: the 'decode' option is not a decoding plan: {e}") from e


def _positive_int(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise KafkaSourceError(f"{SOURCE_NAME}: {name} must be an integer, got {text!r}") from e
    if value <= 0:
        raise KafkaSourceError(f"{SOURCE_NAME}: {name} must be positive, got {value}")
    return value


class KafkaInputPartition(InputPartition):
    """The offset ranges one Spark task reads, one after the other (`plan_partitions`)."""

    def __init__(self, ranges: Sequence[OffsetRange]) -> None:
        super().__init__(tuple(ranges))
        self.ranges = tuple(ranges)


class _ReaderBase:
    """Shared by the stream and batch readers. Pickled to executors: Kafka clients are
    created lazily and never pickled."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._finder: EndFinder | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_finder"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def _end_finder(self) -> EndFinder:
        if self._finder is None:
            self._finder = EndFinder(
                self.options.kafka, self.options.poll_timeout_s, self.options.probe_timeout_s
            )
        return self._finder

    def _close_finder(self) -> None:
        if self._finder is not None:
            self._finder.close()
            self._finder = None

    def _ranges(
        self, start: Mapping[TopicPartitionKey, int], end: Mapping[TopicPartitionKey, int]
    ) -> list[KafkaInputPartition]:
        return [
            KafkaInputPartition(piece)
            for piece in plan_partitions(
                start, end, self.options.max_records_per_partition, self.options.min_partitions
            )
        ]

    def _read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pyspark.sql.pandas.types import to_arrow_schema

        if not isinstance(partition, KafkaInputPartition):
            raise KafkaSourceError(f"unexpected partition {partition!r}")
        schema = to_arrow_schema(SOURCE_SCHEMA, timezone="UTC")
        # A consumer per range: one consumer assigned to the next range after reading a
        # partition to its end got its first records 1 s later on the embedded broker (3
        # of 4 tries; likely its fetch at that end still outstanding), a new one ~5 ms.
        records = itertools.chain.from_iterable(
            read_range(
                self.options.kafka,
                rng,
                schema,
                self.options.poll_timeout_s,
                fail_on_data_loss=self.options.fail_on_data_loss,
            )
            for rng in partition.ranges
        )
        plan = decode_plan(self.options.decode)
        if plan is None:
            return records
        from consumers.spark.decode import decode_all

        return decode_all(records, plan)


class KwalKafkaStreamReader(_ReaderBase, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark calls the offset methods of one instance, for the query's life, in its offset
    planning process; `read` runs on pickled copies on the executors."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        super().__init__(options, schema)
        self._target: dict[TopicPartitionKey, int] | None = None
        self._last_available: dict[TopicPartitionKey, int] | None = None
        # what prepareForTriggerAvailableNow saw (partitions, watermarks), for initialOffset
        self._seen: tuple[list[TopicPartitionKey], dict[TopicPartitionKey, tuple[int, int]]] | None = None
        self._initial: dict | None = None

    def initialOffset(self) -> dict:
        """The query's first start offsets, computed once: Spark asks twice before the first
        micro-batch (~50 ms of Kafka calls each on the embedded broker), and an answer
        that changed in between (`latest`) would not be the one it logged. An available-now
        query found the partitions and watermarks just before: they are used."""
        if self._initial is not None:
            return self._initial
        finder = self._end_finder()
        if self._seen is not None:
            keys, wm = self._seen
        else:
            keys = finder.partitions(self.options.topics)
            wm = finder.watermarks(keys)
        needs_end = any(
            self.options.starting.explicit.get(k, self.options.starting.default) == -1 for k in keys
        )
        ends = (
            finder.ends(keys, wm, probe_s=self.options.poll_timeout_s)
            if needs_end
            else {k: h for k, (_l, h) in wm.items()}
        )
        start = {k: self.options.starting.resolve(k, wm[k][0], ends[k]) for k in keys}
        self._initial = to_offset_dict(start)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_records_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        finder = self._end_finder()
        keys = finder.partitions(self.options.topics)
        wm = finder.watermarks(keys)
        self._seen = (keys, wm)
        # the target is the end of what exists now: take the time to find it exactly
        self._target = finder.ends(keys, wm, probe_s=self.options.poll_timeout_s)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_offset_dict(start)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if self._target is not None:
            # available-now: up to the ends found when the run began, whose records exist
            # (a deleted one fails the read: failOnDataLoss). No Kafka call (~50-100 ms).
            keys = sorted(set(self._target) | set(begin))
            available = dict(self._target)
        else:
            finder = self._end_finder()
            keys = sorted(set(finder.partitions(self.options.topics)) | set(begin))
            live = [k for k in keys if k[0] in self.options.topics]
            wm = finder.watermarks(live)
            lower = finder.lower_bounds(wm)
            if max_rows is not None and _backlog(begin, lower) >= max_rows:
                available = lower  # enough known records: no need to find the real end
            else:
                available = finder.ends(live, wm)
        for k in keys:
            have = begin.get(k, 0)
            value = available.get(k, have)
            available[k] = max(value, have) if k in begin else max(value, 0)
        self._last_available = dict(available)
        return to_offset_dict(cap_by_limit(begin, available, max_rows))

    def reportLatestOffset(self) -> dict | None:
        return to_offset_dict(self._last_available) if self._last_available else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self._ranges(from_offset_dict(start), from_offset_dict(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._read(partition)

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        self._close_finder()


class KwalKafkaBatchReader(_ReaderBase, DataSourceReader):
    def partitions(self) -> Sequence[InputPartition]:
        finder = self._end_finder()
        try:
            keys = finder.partitions(self.options.topics)
            wm = finder.watermarks(keys)
            ends = finder.ends(keys, wm, probe_s=self.options.poll_timeout_s)
            start = {k: self.options.starting.resolve(k, wm[k][0], ends[k]) for k in keys}
            end = {k: min(self.options.ending.resolve(k, wm[k][0], ends[k]), ends[k]) for k in keys}
            end = {k: max(end[k], start[k]) for k in keys}
            return self._ranges(start, end)
        finally:
            self._close_finder()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._read(partition)


def read_now(options: Mapping[str, str]) -> Iterator[pa.RecordBatch]:
    """What a batch read with `options` returns (`startingOffsets` to the real end now, as
    record batches of the source's schema), read in this process with confluent-kafka: no
    Spark job, for small topics the driver needs before a query starts (the catalog)."""
    reader = KwalKafkaBatchReader(SourceOptions.parse(options, streaming=False), SOURCE_SCHEMA)
    for partition in reader.partitions():
        yield from reader.read(partition)


def _backlog(begin: Mapping[TopicPartitionKey, int], ends: Mapping[TopicPartitionKey, int]) -> int:
    return sum(max(0, e - begin.get(k, 0)) for k, e in ends.items())


class KwalKafkaDataSource(DataSource):
    """`format("kwal-kafka")`: raw Kafka records (or, with `decode`, change rows), streaming
    or batch."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType | str:
        plan = decode_plan(self.options.get("decode"))
        if plan is None:
            return SOURCE_SCHEMA
        from consumers.spark.decode import wide_ddl

        return wide_ddl(plan.tables)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KwalKafkaStreamReader(SourceOptions.parse(self.options, streaming=True), schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return KwalKafkaBatchReader(SourceOptions.parse(self.options, streaming=False), schema)


def register(spark: Any) -> None:
    """Register `format("kwal-kafka")` on this session (idempotent)."""
    try:
        manager = spark._jsparkSession.sessionState().dataSourceManager()
        if manager.dataSourceExists(SOURCE_NAME):
            return
    except Exception:  # Spark Connect or an internal API change: registering again is harmless
        pass
    spark.dataSource.register(KwalKafkaDataSource)


def builtin_kafka_available(spark: Any) -> bool:
    """True when the built-in Kafka source's jars are on the driver's classpath."""
    try:
        jvm = spark.sparkContext._jvm
    except Exception:  # Spark Connect: no JVM handle
        return False
    if jvm is None:
        return False
    try:
        return bool(jvm.org.apache.spark.util.Utils.classIsLoadable(BUILTIN_PROVIDER_CLASS))
    except Exception:
        pass
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(BUILTIN_PROVIDER_CLASS, False, loader)
        return True
    except Exception:
        return False


_BUILTIN_RENAMES = {
    "maxrecordspertrigger": "maxOffsetsPerTrigger",
    "polltimeoutms": "kafkaConsumer.pollTimeoutMs",
}
_KWAL_ONLY = {"maxrecordsperpartition", "probetimeoutms", "decode"}


def builtin_min_partitions(cores: int, topics: int) -> int:
    """The built-in source's `minPartitions` for this source's `minPartitions` = `cores`
    over `topics` one-partition topics. The built-in source splits offset ranges only when
    there are fewer ranges than `minPartitions`, then each in proportion to its size: given
    `cores` (2) for the job's catalog and table topics (2 ranges), it split nothing, and one
    task decoded the whole table (measured: 7.5 s against 1.2 s for the other task). With
    `cores` per topic, a topic that holds (nearly) all of a batch is split into `cores`
    tasks or more."""
    return max(1, cores) * max(1, topics)


def requested_source(source: str | None = None) -> str:
    """The job's Kafka source by name (`consumers.spark.arguments.SOURCES`): `source` when
    given, else what `KWAL_SPARK_BUILTIN_KAFKA` asks for (1/true/yes: "builtin", 0/false/no:
    "kwal"), else `DEFAULT_SOURCE`. ValueError naming the choices for anything else."""
    if source is None:
        env = os.environ.get("KWAL_SPARK_BUILTIN_KAFKA", "").strip().lower()
        if env in ("1", "true", "yes"):
            source = "builtin"
        elif env in ("0", "false", "no"):
            source = "kwal"
        elif env:
            raise ValueError(f"KWAL_SPARK_BUILTIN_KAFKA is 1 or 0, got {env!r}")
        else:
            source = DEFAULT_SOURCE
    if source not in SOURCES:
        raise ValueError(f"the Spark CN's source is one of {', '.join(SOURCES)}, got {source!r}")
    return source


def choose_source(spark: Any, source: str | None = None) -> str:
    """The source a query on `spark` uses: `requested_source(source)`, except that
    "builtin" falls back to "kwal" (with a warning) when the built-in source's jars are not
    on the classpath (`consumers.spark.jars.delta_jars()` has them)."""
    chosen = requested_source(source)
    if chosen == "builtin" and not builtin_kafka_available(spark):
        log.warning(
            "built-in Kafka source requested but %s is not on the classpath "
            "(consumers.spark.jars.delta_jars() has it: pass them as spark.jars); "
            "using %s",
            BUILTIN_PROVIDER_CLASS,
            SOURCE_NAME,
        )
        return "kwal"
    return chosen


def kafka_stream(
    spark: Any,
    bootstrap: str,
    topics: str | Sequence[str],
    use_builtin: bool | None = None,
    **options: Any,
) -> Any:
    """A streaming DataFrame of raw Kafka records (same columns either way), or of decoded
    change rows when `decode` (a plan) is given and this module's source is used: the
    built-in source does not decode, so a caller that passes `decode` tells the two apart
    by the DataFrame's columns.

    `use_builtin=True` asks for the built-in `format("kafka")`, False for this module's;
    None for `choose_source(spark)` (the option's default, or `KWAL_SPARK_BUILTIN_KAFKA`).
    The built-in one is used only when its jars are on the classpath, else this module's
    source is (with a warning)."""
    topic_list = parse_topics(topics)
    requested = None if use_builtin is None else ("builtin" if use_builtin else "kwal")
    use_builtin = choose_source(spark, requested) == "builtin"
    reader = spark.readStream
    if use_builtin:
        reader = (
            reader.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", ",".join(topic_list))
            .option("includeHeaders", "true")
        )
        for key, value in options.items():
            if key.lower() in _KWAL_ONLY:
                continue
            if key.lower() == "minpartitions":
                value = builtin_min_partitions(int(value), len(topic_list))
            reader = reader.option(_BUILTIN_RENAMES.get(key.lower(), key), str(value))
        return reader.load()
    register(spark)
    reader = (
        reader.format(SOURCE_NAME)
        .option("bootstrap", bootstrap)
        .option("topics", ",".join(topic_list))
    )
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()
