"""Which Kafka features the broker really has, found by trying them (`kwal doctor` prints it).

Every probe runs on a scratch topic of its own and has a bounded wait. The
result is tri-state: works, missing, or unknown (the probe could not decide,
e.g. retention that real Kafka enforces only every few minutes). Code that
depends on a feature asks `probe(cfg)` (cached per bootstrap address) instead
of assuming; DESIGN.md lists what the embedded broker is known to lack.

The DeleteRecords probe runs last, on a client of its own: on the embedded
broker it breaks the connection.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from infra.config import KwalConfig
from infra.topics import alter_topic_configs

log = logging.getLogger(__name__)

WORKS, MISSING, UNKNOWN = "works", "missing", "unknown"


@dataclass(frozen=True)
class Probe:
    status: str  # works | missing | unknown
    detail: str = ""

    @property
    def works(self) -> bool:
        return self.status == WORKS


@dataclass
class BrokerFeatures:
    bootstrap: str
    idempotent_producer: Probe = field(default_factory=lambda: Probe(UNKNOWN))
    exact_high_watermark: Probe = field(default_factory=lambda: Probe(UNKNOWN))
    offsets_for_times: Probe = field(default_factory=lambda: Probe(UNKNOWN))
    transactions: Probe = field(default_factory=lambda: Probe(UNKNOWN))
    read_committed: Probe = field(default_factory=lambda: Probe(UNKNOWN))
    retention_enforced: Probe = field(default_factory=lambda: Probe(UNKNOWN))
    delete_records: Probe = field(default_factory=lambda: Probe(UNKNOWN))

    def items(self) -> list[tuple[str, Probe]]:
        return [(k, v) for k, v in vars(self).items() if isinstance(v, Probe)]


class BrokerUnreachableError(RuntimeError):
    """Nothing answered a Metadata request at the configured address."""


_cache: dict[str, BrokerFeatures] = {}
_one_cache: dict[tuple[str, str], Probe] = {}
_cache_lock = threading.Lock()


def probe(cfg: KwalConfig, timeout_s: float = 10.0, refresh: bool = False) -> BrokerFeatures:
    """The broker's features, probed once per process per bootstrap address."""
    with _cache_lock:
        if not refresh and cfg.bootstrap in _cache:
            return _cache[cfg.bootstrap]
    features = _Prober(cfg, timeout_s).run()
    with _cache_lock:
        _cache[cfg.bootstrap] = features
    return features


def probe_one(cfg: KwalConfig, feature: str, timeout_s: float = 10.0) -> Probe:
    """One feature only (e.g. "delete_records"): what a component asks at start-up,
    without paying for the slow probes (retention waits seconds)."""
    with _cache_lock:
        if cfg.bootstrap in _cache:
            return getattr(_cache[cfg.bootstrap], feature)
        if (cfg.bootstrap, feature) in _one_cache:
            return _one_cache[(cfg.bootstrap, feature)]
    prober = _Prober(cfg, timeout_s)
    prober.reachable()
    result = prober._guard(getattr(prober, f"_{_PROBES[feature]}"))
    prober._cleanup()
    with _cache_lock:
        _one_cache[(cfg.bootstrap, feature)] = result
    return result


def deletes_records(cfg: KwalConfig, what: str) -> bool:
    """Whether `what` (the WAL, the logtail) may be truncated with DeleteRecords.

    Conservative: False when the probe fails (truncation is then logical only;
    the embedded broker breaks the connection on DeleteRecords).
    """
    try:
        return probe_one(cfg, "delete_records").works
    except Exception as e:  # noqa: BLE001 - a failing probe means "don't"
        log.warning("kwal doctor probe failed (%s); %s truncation will be logical only", e, what)
        return False


FENCES = ("auto", "transactions", "epoch")


def fences_at_broker(cfg: KwalConfig) -> bool:
    """Whether the TN fences a replaced TN at the broker (transactions, read_committed;
    docs/fencing.md): `wal.fence` says so, or, on auto, the read_committed probe works
    (a broker whose read_committed shows aborted records cannot hide a zombie's writes)."""
    mode = cfg.wal.fence
    if mode not in FENCES:
        raise ValueError(f"wal.fence must be one of {', '.join(FENCES)}, got {mode!r}")
    if mode != "auto":
        return mode == "transactions"
    try:
        return probe_one(cfg, "read_committed").works
    except Exception as e:  # noqa: BLE001 - a failing probe: the broker cannot be trusted with it
        log.warning("kwal doctor probe failed (%s); no split-brain fencing at the broker", e)
        return False


def split_brain_safety(features: BrokerFeatures) -> str:
    """The line `kwal doctor` prints about split-brain safety."""
    if features.read_committed.works:
        return "available: a replaced TN is fenced at the broker (transactions, read_committed)"
    return (
        "UNAVAILABLE on this broker: read_committed does not hide aborted records "
        f"({features.read_committed.status}), so a TN paused while another takes its WAL "
        "over can acknowledge commits that are then lost (docs/fencing.md)"
    )


# feature name -> the _Prober method that tries it
_PROBES = {
    "idempotent_producer": "idempotent",
    "exact_high_watermark": "high_watermark",
    "offsets_for_times": "offsets_for_times",
    "transactions": "transactions",
    "read_committed": "read_committed",
    "retention_enforced": "retention",
    "delete_records": "delete_records",
}


LEFTOVER_AGE_S = 600  # a retention-probe topic older than this is deleted by the next run


class _Prober:
    def __init__(self, cfg: KwalConfig, timeout_s: float) -> None:
        self.cfg = cfg
        self.timeout_s = timeout_s
        self.admin = AdminClient(cfg.kafka_client(**{"socket.timeout.ms": int(timeout_s * 1000)}))
        # the creation time in the name lets a later run delete a leftover (`_cleanup`)
        self.prefix = f"{cfg.topics.prefix}.doctor-{int(time.time())}-{uuid.uuid4().hex[:8]}"
        self.created: list[str] = []

    def reachable(self) -> None:
        try:
            md = self.admin.list_topics(timeout=self.timeout_s)
            if not md.brokers:
                raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        except KafkaException as e:
            raise BrokerUnreachableError(
                f"no Kafka broker answered at {self.cfg.bootstrap} within {self.timeout_s:.0f}s ({e})"
            ) from e

    def run(self) -> BrokerFeatures:
        self.reachable()
        f = BrokerFeatures(self.cfg.bootstrap)
        f.idempotent_producer = self._guard(self._idempotent)
        f.exact_high_watermark = self._guard(self._high_watermark)
        f.offsets_for_times = self._guard(self._offsets_for_times)
        f.transactions = self._guard(self._transactions)
        f.read_committed = (
            self._guard(self._read_committed)
            if f.transactions.works
            else Probe(UNKNOWN, "needs transactions")
        )
        f.retention_enforced = self._guard(self._retention)
        f.delete_records = self._guard(self._delete_records)
        self._cleanup()
        return f

    def _guard(self, fn: Callable[[], Probe]) -> Probe:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - a probe that blows up reports why
            return Probe(MISSING, f"{type(e).__name__}: {e}"[:200])

    # -- helpers -----------------------------------------------------------

    def _topic(self, role: str, config: dict[str, str] | None = None) -> str:
        name = f"{self.prefix}.{role}"
        fut = self.admin.create_topics([NewTopic(name, 1, 1, config=config or {})])[name]
        fut.result(timeout=self.timeout_s)
        self.created.append(name)
        return name

    def _producer(self, **extra: Any) -> Producer:
        return Producer(self.cfg.kafka_client(**{"acks": "all", "linger.ms": 5, **extra}))

    def _consumer(self, **extra: Any) -> Consumer:
        return Consumer(
            self.cfg.kafka_client(
                **{
                    "group.id": f"{self.prefix}-probe",
                    "enable.auto.commit": False,
                    "fetch.wait.max.ms": 50,
                    **extra,
                }
            )
        )

    def _produce(self, producer: Producer, topic: str, values: list[bytes], timestamps: list[int] | None = None) -> None:
        errors: list[str] = []

        def report(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for i, v in enumerate(values):
            kwargs: dict[str, Any] = {"on_delivery": report}
            if timestamps:
                kwargs["timestamp"] = timestamps[i]
            producer.produce(topic, v, **kwargs)
        left = producer.flush(self.timeout_s)
        if left or errors:
            raise RuntimeError(f"produce failed: {errors[:1] or f'{left} undelivered'}")

    def _read_all(
        self, consumer: Consumer, topic: str, expect: int, until: bytes | None = None
    ) -> list[bytes]:
        """Up to `expect` records from offset 0; stops early once `until` was read (the
        last record produced: nothing can follow it)."""
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + self.timeout_s / 2
        while len(got) < expect and time.monotonic() < deadline:
            if until is not None and until in got:
                break
            for m in consumer.consume(expect - len(got), 0.2):
                if m.error() is None:
                    got.append(m.value() or b"")
        return got

    # -- probes ------------------------------------------------------------

    def _idempotent(self) -> Probe:
        topic = self._topic("idem")
        p = self._producer(**{"enable.idempotence": True})
        self._produce(p, topic, [b"a", b"b"])
        return Probe(WORKS, "acks=all + enable.idempotence delivered")

    def _high_watermark(self) -> Probe:
        topic = self._topic("hwm")
        p = self._producer(**{"linger.ms": 50})
        self._produce(p, topic, [b"x%d" % i for i in range(10)])
        c = self._consumer()
        try:
            _low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=self.timeout_s)
        finally:
            c.close()
        if high == 10:
            return Probe(WORKS, "high watermark 10 after 10 records")
        return Probe(MISSING, f"high watermark {high} after 10 records in one batch (expected 10)")

    def _offsets_for_times(self) -> Probe:
        topic = self._topic("times")
        base = int(time.time() * 1000) - 60_000
        stamps = [base, base + 10_000, base + 20_000]
        p = self._producer(**{"linger.ms": 0})
        for v, ts in zip([b"a", b"b", b"c"], stamps, strict=True):
            self._produce(p, topic, [v], [ts])
        c = self._consumer()
        try:
            res = c.offsets_for_times([TopicPartition(topic, 0, base + 10_000)], timeout=self.timeout_s)
        finally:
            c.close()
        got = res[0].offset
        if got == 1:
            return Probe(WORKS, "offset 1 for the second record's timestamp")
        return Probe(MISSING, f"offsets_for_times gave offset {got}, expected 1")

    def _transactions(self) -> Probe:
        topic = self._topic("txn")
        p = self._producer(**{"transactional.id": f"{self.prefix}-txn"})
        p.init_transactions(self.timeout_s)
        p.begin_transaction()
        self._produce(p, topic, [b"t"])
        p.commit_transaction(self.timeout_s)
        return Probe(WORKS, "init/begin/commit transaction succeeded")

    def _read_committed(self) -> Probe:
        topic = self._topic("rc")
        p = self._producer(**{"transactional.id": f"{self.prefix}-rc"})
        p.init_transactions(self.timeout_s)
        p.begin_transaction()
        self._produce(p, topic, [b"aborted"])
        p.abort_transaction(self.timeout_s)
        p.begin_transaction()
        self._produce(p, topic, [b"committed"])
        p.commit_transaction(self.timeout_s)
        c = self._consumer(**{"isolation.level": "read_committed"})
        try:
            got = self._read_all(c, topic, 2, until=b"committed")
        finally:
            c.close()
        if b"aborted" in got:
            return Probe(MISSING, "a read_committed consumer saw an aborted record")
        if b"committed" in got:
            return Probe(WORKS, "aborted record hidden, committed one seen")
        return Probe(UNKNOWN, "the committed record did not arrive in time")

    def _retention(self) -> Probe:
        wait_s = min(6.0, self.timeout_s)
        # no small segment.bytes: Kafka 4.x refuses one below 1 MiB, and expired records
        # are deleted with their segment (the active one is rolled first) anyway
        topic = self._topic("ret", {"retention.ms": "1000", "segment.ms": "100"})
        # Not deleted afterwards: Kafka can race a topic deletion against the retention
        # task still deleting that topic's segments (a rename meets a missing file, Kafka
        # takes the log dir offline and a single-dir broker shuts down; seen in CI). The
        # topic is left empty with its retention turned off instead.
        self.created.remove(topic)
        old = int(time.time() * 1000) - 3_600_000
        p = self._producer(**{"linger.ms": 0})
        self._produce(p, topic, [b"r" * 600 for _ in range(4)], [old] * 4)
        c = self._consumer()
        try:
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                low, _high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=self.timeout_s)
                if low > 0:
                    return Probe(WORKS, f"low watermark moved to {low} under retention.ms=1000")
                time.sleep(0.5)
        finally:
            c.close()
            self._retention_off(topic)
        return Probe(
            MISSING,
            f"retention.ms=1000 deleted nothing within {wait_s:.0f}s (real Kafka checks every "
            "log.retention.check.interval.ms, so this can be a false 'missing' there)",
        )

    def _delete_records(self) -> Probe:
        topic = self._topic("del")
        self._produce(self._producer(), topic, [b"d%d" % i for i in range(5)])
        admin = AdminClient(self.cfg.kafka_client(**{"socket.timeout.ms": int(self.timeout_s * 1000)}))
        futures = admin.delete_records(
            [TopicPartition(topic, 0, 3)],
            request_timeout=self.timeout_s,
            operation_timeout=self.timeout_s,
        )
        for fut in futures.values():
            fut.result(timeout=self.timeout_s)
        c = self._consumer()
        try:
            low, _ = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=self.timeout_s)
        finally:
            c.close()
        if low == 3:
            return Probe(WORKS, "low watermark 3 after DeleteRecords to 3")
        return Probe(MISSING, f"DeleteRecords answered but low watermark is {low}, expected 3")

    def _retention_off(self, topic: str) -> None:
        try:
            alter_topic_configs(self.admin, [topic], {"retention.ms": -1}, self.timeout_s)
        except Exception:  # noqa: BLE001 - a scratch topic; the probe's answer stands
            log.warning("kwal doctor: could not turn retention off on %s", topic)

    def _cleanup(self) -> None:
        """Delete this run's scratch topics and the retention probe's topics that earlier
        runs left (`_retention`), once they are older than `LEFTOVER_AGE_S`: by then no
        segment deletion of theirs can still be pending (file.delete.delay.ms is 60 s)."""
        doomed = list(self.created) + self._old_leftovers()
        if not doomed:
            return
        try:
            admin = AdminClient(self.cfg.kafka_client())
            for fut in admin.delete_topics(doomed, operation_timeout=5).values():
                fut.result(timeout=5)
        except Exception:  # noqa: BLE001 - scratch topics may outlive a broker without DeleteTopics
            pass

    def _old_leftovers(self) -> list[str]:
        head = f"{self.cfg.topics.prefix}.doctor-"
        try:
            names = self.admin.list_topics(timeout=self.timeout_s).topics
        except KafkaException:
            return []
        now = time.time()
        old = []
        for name in names:
            stamp = name[len(head):].split("-", 1)[0] if name.startswith(head) else ""
            if name.endswith(".ret") and stamp.isdigit() and now - int(stamp) > LEFTOVER_AGE_S:
                old.append(name)
        return old

