"""`kwal install` (ops/install.py): JVM components resolved ahead of time, with the
standard library alone (scripts/setup runs it beside `pip install`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops import install

ROOT = Path(__file__).resolve().parents[2]


def _kwal_install(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -S -m ops.install ARGS`: no site-packages, as scripts/setup runs it."""
    return subprocess.run(
        [sys.executable, "-S", "-m", "ops.install", *args], cwd=ROOT,
        # without KAFKA_HOME: a distribution given there is used as it is, not resolved
        env={**{k: v for k, v in os.environ.items() if k != "KAFKA_HOME"}, **(env or {})},
        capture_output=True, text=True, timeout=600, check=False,
    )


def test_it_runs_without_any_installed_package() -> None:
    """Every module `kwal install` imports is importable with the standard library alone
    (an import of confluent-kafka or pyarrow on its path fails this)."""
    probe = subprocess.run(
        [sys.executable, "-S", "-c",
         "import sys, ops.install; "
         "print(sorted(m for m in sys.modules if m.split('.')[0] in ('confluent_kafka', 'pyarrow', 'pyspark')))"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"


def test_kafka_is_resolved_into_the_cache_once(tmp_path: Path) -> None:
    env = {"KWAL_CACHE_DIR": str(tmp_path)}
    first = _kwal_install("kafka", env=env)
    assert first.returncode == 0, first.stderr
    assert "kafka ready" in first.stdout
    jars = tmp_path / "kafka-4.1.1"
    assert (jars / ".complete").is_file() and any(jars.glob("kafka_2.13-*.jar"))
    listing = sorted(p.name for p in jars.iterdir())
    again = _kwal_install("kafka", env=env)
    assert again.returncode == 0 and "kafka ready" in again.stdout
    assert sorted(p.name for p in jars.iterdir()) == listing
    assert [p.name for p in tmp_path.iterdir()] == ["kafka-4.1.1"]  # nothing else resolved


def test_an_unknown_component_is_refused_by_name_and_nothing_resolves(tmp_path: Path) -> None:
    run = _kwal_install("kafka", "zookeeper", env={"KWAL_CACHE_DIR": str(tmp_path)})
    assert run.returncode == 2
    assert "unknown component(s) zookeeper" in run.stderr and "kafka, spark, registry" in run.stderr
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_a_component_that_fails_is_reported_and_the_next_still_resolves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    done = []

    def fails() -> None:
        raise RuntimeError("mvn could not resolve it")

    monkeypatch.setattr(install, "COMPONENTS", {"first": fails, "second": lambda: done.append("second")})
    assert install.install(["first", "second"]) == ["first: mvn could not resolve it"]
    assert done == ["second"]
