"""Fault: the TN killed with SIGKILL under load on the Kafka WAL: 6 cycles in CI, 20 in
the slow variant.

Shares the harness of the TN issue (tests/service/harness.py): after every kill
each acknowledged commit is present, and at the end the state equals the model
(no aborted or unacknowledged write visible)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.config import KwalConfig
from tests.service.harness import crash_cycles


@pytest.mark.parametrize("cycles", [6, pytest.param(20, marks=pytest.mark.slow)])
def test_tn_sigkill_cycles_on_kafka_wal(kwal_config: KwalConfig, tmp_path: Path, cycles: int) -> None:
    kwal_config.wal.backend = "kafka"
    report = crash_cycles(kwal_config, tmp_path / "crash", cycles=cycles, load_s=(0.3, 0.8), seed=20)
    print(f"{cycles} cycles: {report.committed} commits acknowledged, {report.rows} rows")
    assert report.cycles == cycles
    assert report.committed > 100 and report.rows > 100
