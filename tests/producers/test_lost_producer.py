"""A client process's Kafka clients that reach no broker are replaced: its requests
producer (`producers.client._SharedProducer`), whose waiting requests are sent again
through the new one, and its results reader (`infra.reader_stall` step 5). librdkafka can
lose every broker for good (librdkafka issue 5301), and a client process whose producer or
reader did would time out every commit from then on. A broker of the test's own, stopped
and started again, stands for the lost brokers: the checks cannot tell them apart."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from infra.config import KwalConfig
from infra.metrics import METRICS
from infra.processes import ServerProcess
from infra.reader_stall import LOST_AFTER
from infra.topics import ensure_topics
from producers import Client
from tests.conftest import unique
from tests.faults.broker import RestartableBroker
from tests.waiting import wait_until
from tn.service.process import TnProcess


def _replaced() -> tuple[float, float]:
    """(requests producers replaced, results readers replaced) in this process."""
    get = METRICS.registry.get_sample_value
    return (
        get("kwal_producer_replaced_total") or 0.0,
        get("kwal_reader_replaced_total", {"reader": "results"}) or 0.0,
    )


def test_a_client_whose_producer_and_reader_reach_no_broker_gets_new_ones_and_its_commit_completes(
    s3_server: ServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit sent while the broker is away waits in the producer. After LOST_AFTER failed
    checks the producer and the results reader are replaced (counted, and said in
    warnings). Once the broker is back the request is in the requests topic, sent by the
    new producer, and the commit was not failed meanwhile; a TN started then answers it
    through the new results reader."""
    broker = RestartableBroker(s3_server)
    cfg = KwalConfig.load(environ={}).with_bootstrap(broker.address)
    cfg = dataclasses.replace(
        cfg, client=dataclasses.replace(cfg.client, producer_check_s=0.5, results_stall_s=0.5)
    )
    cfg.topics.prefix = unique("kwal-")
    reader = None
    tn = None
    try:
        ensure_topics(cfg)
        with Client(cfg, "lost") as client:
            producers, readers = _replaced()
            broker.stop()
            fut = client.begin().create_database("lost").commit_async()
            with caplog.at_level(logging.WARNING):
                wait_until(
                    "the producer and the results reader replaced",
                    lambda: _replaced()[0] > producers and _replaced()[1] > readers,
                    60,
                )
            assert f"{LOST_AFTER} checks in a row reached no broker while requests wait" in caplog.text
            assert f"results reader: {LOST_AFTER} stall checks in a row could not read" in caplog.text
            broker.restart()
            reader = Consumer(cfg.kafka_client(**{"group.id": unique("g")}))
            reader.assign([TopicPartition(client.requests_topic, 0, 0)])
            keys: list[bytes] = []

            def request_arrived() -> bool:
                m = reader.poll(0.2)
                if m is not None and m.error() is None:
                    keys.append(m.key() or b"")
                return bool(keys)

            wait_until("the request in the requests topic", request_arrived, 60, poll_s=0)
            assert keys == [client.client_id.encode()]
            assert not fut.done()  # no TN yet: it waits for an answer, it was not failed
            tn = TnProcess(cfg, tmp_path)
            tn.start(timeout_s=120)
            assert fut.result(timeout=60).commit_ts > 0
    finally:
        if reader is not None:
            reader.close()
        if tn is not None:
            tn.kill()
        broker.stop()
