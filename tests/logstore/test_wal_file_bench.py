"""`kwal bench wal --backend file` prints one JSON line with every figure."""

from __future__ import annotations

import argparse
import json

import pytest

from infra.config import KwalConfig
from ops.bench import wal_file


def test_bench_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert wal_file.run(argparse.Namespace(entries=128), KwalConfig()) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    for n in (1, 8, 64):
        for key in ("eps", "mbps", "fsyncs_per_s", "entries_per_fsync", "p50_ms", "p99_ms"):
            assert result[f"group_{n}_{key}"] >= 0
        assert result[f"group_{n}_cpu_us"] > 0  # this process's CPU per entry
        assert result[f"group_{n}_entries"] == (128 // n) * n
    assert result["plain_entries"] == 128
    assert result["plain_eps"] > 0 and result["plain_fsyncs_per_s"] == result["plain_eps"]
    assert result["plain_prealloc_entries"] == 128
    assert result["group_commit_gain"] == round(result["group_64_eps"] / result["plain_eps"], 3)
    assert result["gain_vs_prealloc_plain"] == round(
        result["group_64_eps"] / result["plain_prealloc_eps"], 3
    )
