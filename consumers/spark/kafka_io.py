"""Kafka access for the kwal Spark source: finding the real end of partitions (driver) and
reading an offset range as Arrow record batches (executors). confluent-kafka only; no Spark.

The real end of a partition is not taken from the broker's reported high watermark, which
can lag (the embedded broker reports the base offset of the last batch + 1). Instead:

- the reported high watermark `hw` is a lower bound: offsets below it exist;
- when `hw` has not moved since the last probe, the end found then still holds (a new batch
  always moves the reported value, on both Apache Kafka and the embedded broker);
- otherwise a probe consumer is assigned at `hw - 1` (an offset known to exist) and reads
  until it is at the end as of its last fetch, keeping the highest offset seen: the fetch
  reports end-of-partition (`enable.partition.eof`, an empty fetch), or, after a poll
  that returned a record of the partition, the consumer's position has reached the
  high watermark that fetch reported (librdkafka's cached one; the last stable offset,
  read committed). The second is needed for a topic written more often than the fetch
  wait (heartbeats every few ms): its fetches are never empty, and the probe would read
  new records until its deadline. That reads only the tail (typically the last batch)
  and waits at most one fetch round trip (`fetch.wait.max.ms`) per partition, bounded by
  a deadline.

Every wait is bounded; clients never subscribe (no group join), they `assign()`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, cast

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from consumers.spark.offsets import OffsetRange, TopicPartitionKey
from infra.collector import collector_paused
from infra.kafka_io import poll_batch


class KafkaSourceError(RuntimeError):
    """The source cannot read what Spark asked for (clear reason in the message)."""


class DataLossError(KafkaSourceError):
    """Offsets in the requested range were deleted (truncation, retention) before being read."""


DEFAULT_CONSUMER_CONF: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "error",
    "fetch.wait.max.ms": 50,
    "socket.timeout.ms": 10000,
}


def consumer_conf(kafka_conf: Mapping[str, Any], role: str) -> dict[str, Any]:
    """Settings for a reader/prober consumer: our defaults, then the user's pass-through
    settings (SASL/TLS/...), except the ones the source's correctness depends on."""
    conf: dict[str, Any] = dict(DEFAULT_CONSUMER_CONF)
    conf["group.id"] = f"kwal-spark-{role}-{uuid.uuid4().hex[:8]}"  # never joined: assign() only
    conf["client.id"] = f"kwal-spark-{role}"
    conf.update(kafka_conf)
    conf.update(
        {
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "enable.auto.commit": False,
            # a replaced (fenced) TN's records are aborted: never read (docs/fencing.md)
            "isolation.level": "read_committed",
        }
    )
    if "bootstrap.servers" not in conf:
        raise KafkaSourceError("no Kafka bootstrap: set the 'bootstrap' option")
    return conf


class EndFinder:
    """Partition discovery, watermarks and real partition ends (driver side, long-lived)."""

    def __init__(
        self, kafka_conf: Mapping[str, Any], timeout_s: float, probe_s: float = 1.0
    ) -> None:
        self._conf = dict(kafka_conf)
        self._timeout_s = timeout_s
        self._probe_s = min(probe_s, timeout_s)
        self._consumer: Consumer | None = None
        # (topic, partition) -> (reported high watermark, real end confirmed for it)
        self._confirmed: dict[TopicPartitionKey, tuple[int, int]] = {}
        self.probes = 0  # number of tail probes run (for tests and metrics)

    def _c(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(consumer_conf(self._conf, "probe"))
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            finally:
                self._consumer = None

    def partitions(self, topics: Iterable[str]) -> list[TopicPartitionKey]:
        """The topics' partitions now; a topic that does not exist (yet) has none."""
        keys: list[TopicPartitionKey] = []
        for topic in topics:
            try:
                md = self._c().list_topics(topic, timeout=self._timeout_s)
            except KafkaException as e:
                raise KafkaSourceError(f"cannot list partitions of topic {topic!r}: {e}") from e
            tmd = md.topics.get(topic)
            if tmd is None or tmd.error is not None:
                continue
            keys.extend((topic, p) for p in sorted(tmd.partitions))
        return sorted(keys)

    def watermarks(
        self, keys: Iterable[TopicPartitionKey]
    ) -> dict[TopicPartitionKey, tuple[int, int]]:
        out: dict[TopicPartitionKey, tuple[int, int]] = {}
        for topic, partition in keys:
            try:
                low, high = self._c().get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=self._timeout_s, cached=False
                )
            except KafkaException as e:
                raise KafkaSourceError(
                    f"cannot read the offsets of {topic}[{partition}]: {e}"
                ) from e
            out[(topic, partition)] = (int(low), int(high))
        return out

    def lower_bounds(
        self, wm: Mapping[TopicPartitionKey, tuple[int, int]]
    ) -> dict[TopicPartitionKey, int]:
        """Offsets below which records are known to exist, without probing."""
        out: dict[TopicPartitionKey, int] = {}
        for key, (_low, high) in wm.items():
            known = self._confirmed.get(key)
            out[key] = max(high, known[1]) if known and known[0] == high else high
        return out

    def ends(
        self,
        keys: Iterable[TopicPartitionKey],
        wm: Mapping[TopicPartitionKey, tuple[int, int]] | None = None,
        probe_s: float | None = None,
    ) -> dict[TopicPartitionKey, int]:
        """The real end (next offset to be written) of each partition, probing the tail of
        those whose reported high watermark moved. The probe is bounded by `probe_s` (default:
        the finder's probe bound): a partition whose probe does not reach end-of-partition in
        time (a producer writing faster than the probe reads) gets the highest end seen, a
        lower bound: safe, the rest is picked up by a later micro-batch, and it is probed
        again next time (only a probe that reached the end is remembered)."""
        keys = list(keys)
        wm = dict(wm) if wm is not None else self.watermarks(keys)
        out: dict[TopicPartitionKey, int] = {}
        seek: dict[TopicPartitionKey, int] = {}
        for key in keys:
            low, high = wm[key]
            known = self._confirmed.get(key)
            if known is not None and known[0] == high:
                out[key] = known[1]
            elif high <= low:
                out[key] = high
                self._confirmed[key] = (high, high)
            else:
                seek[key] = high - 1
        if seek:
            found = self._probe(seek, self._probe_s if probe_s is None else probe_s)
            for key, (end, confirmed) in found.items():
                out[key] = end
                if confirmed:
                    self._confirmed[key] = (wm[key][1], end)
        return out

    def _probe(
        self, seek: Mapping[TopicPartitionKey, int], bound_s: float
    ) -> dict[TopicPartitionKey, tuple[int, bool]]:
        self.probes += 1
        c = self._c()
        best = {key: off + 1 for key, off in seek.items()}
        pending = set(seek)
        c.assign([TopicPartition(t, p, off) for (t, p), off in seek.items()])
        deadline = time.monotonic() + bound_s
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                fetched: set[TopicPartitionKey] = set()
                for m in poll_batch(c, 10000, min(0.02, left)):
                    key = (str(m.topic()), int(m.partition() or 0))
                    err = m.error()
                    if key not in best:
                        continue
                    if err is None:
                        fetched.add(key)
                        best[key] = max(best[key], _offset(m) + 1)
                    elif err.code() == KafkaError._PARTITION_EOF:
                        best[key] = max(best[key], _offset(m))
                        pending.discard(key)
                    elif err.code() in (
                        KafkaError._AUTO_OFFSET_RESET,
                        KafkaError.OFFSET_OUT_OF_RANGE,
                    ):
                        pending.discard(key)  # deleted under us: keep the lower bound
                    elif err.fatal():
                        raise KafkaSourceError(f"fatal Kafka error while probing {key}: {err}")
                _at_fetched_end(c, fetched & pending, best, pending)
        finally:
            c.unassign()
        return {key: (best[key], key not in pending) for key in seek}


def _at_fetched_end(
    c: Consumer,
    keys: Iterable[TopicPartitionKey],
    best: dict[TopicPartitionKey, int],
    pending: set[TopicPartitionKey],
) -> None:
    """The partitions of `keys` (each got a record from this poll, so from a fetch of this
    probe: the cached high watermark is that fetch's or newer) whose consumer position has
    reached the high watermark of that fetch are at their end: taken off `pending`, their
    end the position (it moves past transaction markers, which are never delivered). An
    unknown watermark or position (-1001) leaves a partition pending."""
    for key in keys:
        tp = TopicPartition(key[0], key[1])
        try:
            _low, high = c.get_watermark_offsets(tp, cached=True)
            position = c.position([tp])[0].offset
        except KafkaException:
            continue
        if high >= 0 and position >= 0 and position >= high:
            best[key] = max(best[key], position)
            pending.discard(key)


def read_range(
    kafka_conf: Mapping[str, Any],
    rng: OffsetRange,
    schema: pa.Schema,
    timeout_s: float,
    chunk: int = 10000,
    fail_on_data_loss: bool = True,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of [rng.start, rng.end) as record batches of `schema` (the
    source's declared schema in Arrow form). Asks the consumer only for the records still
    missing, and fails clearly if no progress is made for `timeout_s` or if records of the
    range were deleted (unless `fail_on_data_loss` is False, then they are skipped)."""
    if rng.end <= rng.start:
        return
    c = Consumer(consumer_conf(kafka_conf, "reader"))
    tp_name = f"{rng.topic}[{rng.partition}]"
    try:
        c.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        nxt = rng.start
        first = True
        idle_deadline = time.monotonic() + timeout_s
        while nxt < rng.end:
            want = min(chunk, rng.end - nxt)
            left = idle_deadline - time.monotonic()
            # The cyclic GC, set off by the many Message objects, doubles the cost of this
            # loop; nothing here builds cycles, so it is paused per chunk (never across a yield).
            batch = None
            with collector_paused():
                msgs = c.consume(want, max(0.01, min(1.0, left))) if left > 0 else []
                keys: list[bytes | None] = []
                values: list[bytes | None] = []
                offsets: list[int] = []
                stamps: list[int | None] = []
                stypes: list[int | None] = []
                headers: list[list[dict[str, Any]] | None] = []
                done = False
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        code = err.code()
                        if code == KafkaError._PARTITION_EOF:
                            if _offset(m) >= rng.end:
                                done = True  # gaps (compaction / control records) up to the end
                            continue
                        if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                            low = _low_watermark(c, rng, timeout_s)
                            if fail_on_data_loss and not rng.from_new_partition:
                                raise DataLossError(
                                    f"{tp_name}: offset {nxt} is no longer available "
                                    f"(log start is now {low}); records in [{nxt}, {rng.end}) "
                                    "were deleted (truncation or retention). Restart from a newer "
                                    "offset, or set failOnDataLoss=false to skip them."
                                )
                            if low is None or low >= rng.end:
                                done = True
                                break
                            nxt = low
                            c.assign([TopicPartition(rng.topic, rng.partition, low)])
                            break
                        if err.fatal():
                            raise KafkaSourceError(f"{tp_name}: fatal Kafka error: {err}")
                        continue  # transient (broker down, ...): librdkafka retries
                    off = _offset(m)
                    if off < nxt:
                        continue
                    if off >= rng.end:
                        done = True
                        break
                    if first and off > rng.start and not rng.from_new_partition:
                        low = _low_watermark(c, rng, timeout_s)
                        if low is not None and low > rng.start and fail_on_data_loss:
                            raise DataLossError(
                                f"{tp_name}: records [{rng.start}, {low}) were deleted before "
                                "they were read (log start moved past the query's offset); "
                                "set failOnDataLoss=false to skip them."
                            )
                    first = False
                    nxt = off + 1
                    keys.append(m.key())
                    values.append(m.value())
                    offsets.append(off)
                    ts_type, ts_ms = m.timestamp()
                    if ts_type == 0:  # TIMESTAMP_NOT_AVAILABLE
                        stamps.append(None)
                        stypes.append(None)
                    else:
                        stamps.append(ts_ms * 1000)
                        stypes.append(ts_type - 1)  # Spark: 0 = CreateTime, 1 = LogAppendTime
                    hs = cast(list[tuple[str, bytes | None]] | None, m.headers())
                    headers.append([{"key": k, "value": v} for k, v in hs] if hs else None)
                if offsets:
                    batch = _batch(schema, rng, keys, values, offsets, stamps, stypes, headers)
            if batch is not None:
                idle_deadline = time.monotonic() + timeout_s
                yield batch
            if done:
                break
            if batch is None and time.monotonic() >= idle_deadline:
                pos = _position(c, rng)
                if pos is not None and pos >= rng.end:
                    break
                raise KafkaSourceError(
                    f"{tp_name}: no record arrived for {timeout_s:.1f}s while reading "
                    f"[{rng.start}, {rng.end}) (next wanted: {nxt}); the broker is unreachable "
                    "or the range is not readable (increase pollTimeoutMs if the broker is slow)"
                )
    finally:
        c.close()


def _batch(
    schema: pa.Schema,
    rng: OffsetRange,
    keys: list[bytes | None],
    values: list[bytes | None],
    offsets: list[int],
    stamps: list[int | None],
    stypes: list[int | None],
    headers: list[list[dict[str, Any]] | None],
) -> pa.RecordBatch:
    n = len(offsets)
    columns = {
        "key": pa.array(keys, type=pa.binary()),
        "value": pa.array(values, type=pa.binary()),
        "topic": pa.array([rng.topic] * n, type=pa.string()),
        "partition": pa.array([rng.partition] * n, type=pa.int32()),
        "offset": pa.array(offsets, type=pa.int64()),
        "timestamp": pa.array(stamps, type=pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        "timestampType": pa.array(stypes, type=pa.int32()),
    }
    if "headers" in schema.names:
        columns["headers"] = pa.array(headers, type=schema.field("headers").type)
    return pa.RecordBatch.from_arrays([columns[f.name] for f in schema], schema=schema)


def _offset(m: Message) -> int:
    off = m.offset()
    return int(off) if off is not None else -1


def _low_watermark(c: Consumer, rng: OffsetRange, timeout_s: float) -> int | None:
    try:
        low, _high = c.get_watermark_offsets(
            TopicPartition(rng.topic, rng.partition), timeout=timeout_s, cached=False
        )
        return int(low)
    except KafkaException:
        return None


def _position(c: Consumer, rng: OffsetRange) -> int | None:
    try:
        pos = c.position([TopicPartition(rng.topic, rng.partition)])[0].offset
        return int(pos) if pos >= 0 else None
    except KafkaException:
        return None
