"""Kill -9 the TN (a subprocess) under load and restart it; see harness.py.

A few cycles per log backend here; the 20-cycle version is a `slow` test."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.config import KwalConfig
from tests.service.harness import crash_cycles


@pytest.mark.parametrize("backend", ["file", pytest.param("kafka", marks=pytest.mark.slow)])
def test_kill9_cycles_keep_acknowledged_commits(
    kwal_config: KwalConfig, tmp_path: Path, backend: str
) -> None:
    kwal_config.wal.backend = backend
    report = crash_cycles(kwal_config, tmp_path / "crash", cycles=3)
    assert report.committed > 50 and report.rows > 50
