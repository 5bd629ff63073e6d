"""`kwal bench wal --backend kafka` prints one JSON line with both sides' figures."""

from __future__ import annotations

import argparse
import json

import pytest

from infra.config import KwalConfig
from ops.bench import wal_kafka


def test_bench_prints_one_json_line(
    kwal_config: KwalConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    # The session's broker answers at kwal_config.bootstrap: the bench uses it (and so
    # reports no broker CPU: that figure is only for a broker the bench started itself).
    assert wal_kafka.run(argparse.Namespace(entries=64), kwal_config) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["embedded_broker"] is False
    for side in ("raw", "driver"):
        for n in (1, 8, 64):
            assert result[f"{side}_{n}_n"] == 64
            assert result[f"{side}_{n}_eps"] > 0
            assert result[f"{side}_{n}_cpu_us"] > 0
            assert 0 < result[f"{side}_{n}_p50_ms"] <= result[f"{side}_{n}_p99_ms"]
            assert f"{side}_{n}_broker_cpu_us" not in result
    assert result["vs_raw_64"] == round(result["driver_64_eps"] / result["raw_64_eps"], 3)
    assert result["p99_vs_raw_1"] == round(
        result["driver_1_p99_ms"] / result["raw_1_p99_ms"], 3
    )
