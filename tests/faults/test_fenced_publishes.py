"""Fault: what a fenced TN publishes is never read (docs/fencing.md).

A TN (in this process: its Kafka WAL, engine, logtail publisher and service wired as
`tn.service.main` wires them, results and logtail on channels of the WAL's
transactional bus) serves a client; a second writer then opens the same WAL, which
fences the first (`init_transactions` of the same `transactional.id`). The first,
still running, is then made to publish each kind of record a TN writes besides its WAL:

1. a result (an answer that needs no WAL entry: an insert into a table that does not
   exist, answered by the service's publisher);
2. logtail records (a heartbeat: on the catalog topic and the table's topic);
3. a commit (a WAL record, with the result that rides it).

Each kind is first published BEFORE the fence, and a read_committed reader sees it
(the check below can see such records); AFTER the fence, once the TN has had its
answer from Kafka for each, a read_committed reader sees none of them: every topic
holds exactly what it held at the fence. Until 2026-11-27 an idle bus channel was
falsy and the service and the publisher took a plain idempotent producer instead,
so 1 and 2 were read (docs/fencing.md, "Fixed 2026-11-27").
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from infra.config import KwalConfig
from infra.topics import ensure_topics
from producers import Client, CommitResult, ProducerError
from tests.waiting import wait_until
from tn.engine import Engine
from tn.logstore.driver import LogStore
from tn.logstore.kafka_backend import KafkaDriver
from tn.logtail.wiring import Logtail, attach_logtail
from tn.service.service import TnService

DB, TABLE = "fp", "t"
NAME = f"{DB}.{TABLE}"


class _Tn:
    """The parts of a TN `tn.service.main._serve` starts, minus checkpoints: heartbeats
    are run by the test (`engine.heartbeat()`), and the service's progress is written
    once at start only, so that nothing but the test's requests makes the TN write."""

    def __init__(self, cfg: KwalConfig) -> None:
        self.driver = KafkaDriver(cfg)
        bus = self.driver.bus
        assert bus is not None, "the session broker fences with transactions"
        self.bus = bus
        self.log = LogStore(self.driver)
        self.engine = Engine(self.log)
        self.logtail: Logtail = attach_logtail(
            self.engine, cfg, heartbeats=False, producer=bus.channel()
        )
        self.service = TnService(
            cfg, self.engine, producer=bus.channel(), progress_interval_s=3600.0
        )
        self.service.start()

    def close(self) -> None:
        self.service.stop(drain_timeout_s=2.0)
        self.logtail.close(2.0)
        self.engine.close()
        self.log.close()


@pytest.fixture
def tn(kwal_config: KwalConfig) -> Iterator[_Tn]:
    kwal_config.wal.backend = "kafka"
    kwal_config.wal.fence = "transactions"
    ensure_topics(kwal_config)
    t = _Tn(kwal_config)
    try:
        yield t
    finally:
        t.close()


def _visible(cfg: KwalConfig, topics: list[str]) -> dict[str, list[bytes]]:
    """Per topic, the keys of the records a read_committed reader sees, from the start to
    the end (the partition EOF: the last stable offset; a trailing commit marker is not a
    message, so the position never reaches the high watermark)."""
    c = Consumer(
        cfg.kafka_client(
            **{
                "group.id": f"{cfg.topics.prefix}.fence-check",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
            }
        )
    )
    out: dict[str, list[bytes]] = {t: [] for t in topics}
    try:
        c.assign([TopicPartition(t, 0, 0) for t in topics])
        at_end: set[str] = set()
        deadline = time.monotonic() + 30
        while len(at_end) < len(topics):
            assert time.monotonic() < deadline, f"reading {topics} did not end"
            for m in c.consume(500, 0.1):
                err, topic = m.error(), str(m.topic())
                if err is None:
                    out[topic].append(m.key() or b"")
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(topic)
    finally:
        c.close()
    return out


def _publish_all(
    tn: _Tn, client: Client, row: int
) -> tuple[Future[CommitResult], Future[CommitResult]]:
    """Steps 1-3 of the module docstring: the answer to a request without a WAL entry,
    a heartbeat (waited for: the publisher has had Kafka's answer for its records), a
    commit. Returns the futures of 1 and 3."""
    aborted = client.begin().insert(f"{DB}.missing", [{"id": row}]).commit_async()
    wait_until(
        "the TN answered the request, or its producer is refused (fenced)",
        lambda: aborted.done() or tn.bus.failure is not None,
        30,
    )
    assert tn.service._producer.flush(10) == 0  # its answer was sent and reported on
    tn.engine.heartbeat().result(10)
    assert tn.logtail.publisher.flush(10)
    committed = client.begin().insert(NAME, [{"id": row, "v": f"v{row}"}]).commit_async()
    return aborted, committed


def test_nothing_a_fenced_tn_publishes_is_read(kwal_config: KwalConfig, tn: _Tn) -> None:
    cfg = kwal_config
    topics = [cfg.topics.results, cfg.topics.catalog, cfg.topics.logtail(DB, TABLE)]
    with Client(cfg, "fence-check") as client:
        setup = client.begin().create_database(DB)
        setup.create_table(NAME, [("id", "int64"), ("v", "string")], "id")
        setup.commit(timeout=30)
        assert tn.logtail.publisher.flush(10)
        before = _visible(cfg, topics)

        # before the fence: each kind of record is read
        aborted, committed = _publish_all(tn, client, 1)
        with pytest.raises(ProducerError):
            aborted.result(10)
        committed.result(10)
        tn.engine.heartbeat().result(10)  # the table's topic gets the next heartbeat too
        assert tn.logtail.publisher.flush(10)
        live = _visible(cfg, topics)
        for topic in topics:
            assert len(live[topic]) > len(before[topic]), f"nothing new on {topic} before the fence"

        # a newer writer opens the WAL: the first TN is fenced, but still runs
        fencer = KafkaDriver(cfg)
        try:
            aborted, committed = _publish_all(tn, client, 2)
            wait_until(
                "the fenced TN's commit fails", lambda: tn.engine.log_failure is not None, 30
            )
            after = _visible(cfg, topics)
            assert after == live, {t: after[t][len(live[t]) :] for t in topics}
            assert tn.bus.failure is not None, "the fenced TN's producer was never refused"
            # no answer either: a fenced TN leaves its requests to the TN that took over
            assert not committed.done() and not aborted.done()
        finally:
            fencer.close()
