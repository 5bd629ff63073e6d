"""Fault: the TN killed with SIGKILL under load, 20 cycles, on the Kafka WAL.

Shares the harness of the TN issue (tests/service/harness.py): after every kill
each acknowledged commit is present, and at the end the state equals the model
(no aborted or unacknowledged write visible)."""

from __future__ import annotations

from pathlib import Path

from infra.config import KwalConfig
from tests.service.harness import crash_cycles


def test_tn_sigkill_20_cycles_on_kafka_wal(kwal_config: KwalConfig, tmp_path: Path) -> None:
    kwal_config.wal.backend = "kafka"
    report = crash_cycles(kwal_config, tmp_path / "crash", cycles=20, load_s=(0.3, 0.8), seed=20)
    assert report.cycles == 20
    assert report.committed > 100 and report.rows > 100
