"""The Spark CN's source choice (`--source`, KWAL_SPARK_BUILTIN_KAFKA) and the built-in
source's partitioning: pure functions, no session."""

from __future__ import annotations

import argparse

import pytest

from consumers.spark.arguments import DEFAULT_SOURCE, SOURCES, add_job_arguments
from consumers.spark.source import builtin_min_partitions, requested_source


def test_the_option_wins_then_the_environment_then_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KWAL_SPARK_BUILTIN_KAFKA", raising=False)
    assert requested_source() == DEFAULT_SOURCE
    assert [requested_source(s) for s in SOURCES] == list(SOURCES)
    monkeypatch.setenv("KWAL_SPARK_BUILTIN_KAFKA", "1")
    assert requested_source() == "builtin"
    assert requested_source("kwal") == "kwal"
    monkeypatch.setenv("KWAL_SPARK_BUILTIN_KAFKA", "0")
    assert requested_source() == "kwal"
    monkeypatch.setenv("KWAL_SPARK_BUILTIN_KAFKA", "maybe")
    with pytest.raises(ValueError, match="KWAL_SPARK_BUILTIN_KAFKA is 1 or 0, got 'maybe'"):
        requested_source()
    with pytest.raises(ValueError, match="one of kwal, builtin, got 'kafka'"):
        requested_source("kafka")


def test_the_job_takes_a_source_argument() -> None:
    parser = argparse.ArgumentParser()
    add_job_arguments(parser)
    base = ["--tables", "db.t", "--output", "/tmp/x"]
    assert parser.parse_args(base).source is None  # requested_source decides
    assert parser.parse_args([*base, "--source", "builtin"]).source == "builtin"
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--source", "kafka"])


def test_builtin_min_partitions_splits_the_busy_topic_across_the_cores() -> None:
    # the built-in source splits ranges only when there are fewer than minPartitions
    assert builtin_min_partitions(2, 2) == 4  # catalog + one table on 2 cores
    assert builtin_min_partitions(2, 1) == 2
    assert builtin_min_partitions(0, 3) == 3
