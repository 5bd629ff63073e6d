"""Fixtures for the lifecycle tests (truncation, retention, restart) on a broker that deletes.

They need a broker with DeleteRecords and enforced retention: Apache Kafka, the suite's
default. On the embedded Tansu broker (`KWAL_TEST_BROKER=tansu`), which has neither,
they skip and say so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from infra.config import KwalConfig
from infra.logsize import broker_data_dir, log_start_offsets
from infra.processes import ServerProcess


@pytest.fixture
def lc_config(kwal_config: KwalConfig) -> KwalConfig:
    """The Kafka WAL backend with short timeouts, on a broker that deletes records."""
    from infra.capabilities import probe_one

    kwal_config.wal.backend = "kafka"
    kwal_config.wal.append_timeout_s = 10.0
    feature = probe_one(kwal_config, "delete_records")
    if not feature.works:
        pytest.skip(
            f"the broker lacks DeleteRecords (kwal doctor: {feature.status} {feature.detail}); "
            "the lifecycle tests need Apache Kafka"
        )
    return kwal_config


@pytest.fixture
def data_dir(embedded_broker: ServerProcess | None) -> Path | None:
    """The session broker's data directory when it is a local Apache Kafka node."""
    return broker_data_dir(embedded_broker.log_path) if embedded_broker is not None else None


def starts(cfg: KwalConfig, topic: str, partitions: list[int]) -> dict[int, int]:
    """Log-start offsets (ListOffsets earliest)."""
    return log_start_offsets(AdminClient(cfg.kafka_client()), topic, partitions)
