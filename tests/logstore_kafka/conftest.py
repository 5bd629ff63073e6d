"""Fixtures for the Kafka log backend tests: a config with short timeouts, a raw producer."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from infra.config import KwalConfig
from tn.logstore.kafka_backend.headers import encode_entries, entries_headers


@pytest.fixture
def wal_config(kwal_config: KwalConfig) -> KwalConfig:
    kwal_config.wal.backend = "kafka"
    kwal_config.wal.append_timeout_s = 10.0
    return kwal_config


class RawWal:
    """Writes WAL and meta records directly, to build layouts deliberately."""

    def __init__(self, cfg: KwalConfig) -> None:
        self.cfg = cfg
        self.producer = Producer(cfg.kafka_client(acks="all", **{"linger.ms": 0}))

    def entries(
        self, partition: int, epoch: int, first: int, payloads: list[bytes], acked: int = 0
    ) -> None:
        self.producer.produce(
            self.cfg.topics.wal,
            value=encode_entries(payloads),
            partition=partition,
            headers=entries_headers(epoch, first, len(payloads), acked, f"raw{epoch}"),
        )
        assert self.producer.flush(10) == 0  # one at a time: positions are exactly as written

    def meta(self, key: str, doc: dict[str, object]) -> None:
        self.producer.produce(
            self.cfg.topics.wal_meta, key=key.encode(), value=json.dumps(doc).encode(), partition=0
        )
        assert self.producer.flush(10) == 0

    def epoch(self, epoch: int, base: int) -> None:
        self.meta(f"epoch/{epoch}/raw{epoch}", {"epoch": epoch, "writer": f"raw{epoch}"})
        self.meta(f"base/{epoch}", {"epoch": epoch, "writer": f"raw{epoch}", "base": base})


@pytest.fixture
def raw_wal(wal_config: KwalConfig) -> Iterator[RawWal]:
    from infra.topics import KEEP_FOREVER, TopicSpec, ensure_topics

    ensure_topics(
        wal_config,
        [
            TopicSpec(wal_config.topics.wal, wal_config.topics.wal_partitions, dict(KEEP_FOREVER)),
            TopicSpec(wal_config.topics.wal_meta, 1, {"cleanup.policy": "compact"}),
        ],
    )
    yield RawWal(wal_config)
