"""`KWAL_BROKER_JVM_OPTIONS`: the JVM options of the Apache Kafka nodes the tests start
(tests/conftest.py sets it), JVM_OPTIONS where unset; a node given its own keeps them."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.brokers.apache_kafka import JVM_OPTIONS, JVM_OPTIONS_ENV, KafkaNode
from infra.brokers.kafka_cluster import CLUSTER_JVM_OPTIONS
from infra.config import KwalConfig


def test_the_variable_sets_a_nodes_jvm_options_and_unset_leaves_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(JVM_OPTIONS_ENV, "-Xmx99m -XX:TieredStopAtLevel=1")
    assert KafkaNode(tmp_path).jvm_options == "-Xmx99m -XX:TieredStopAtLevel=1"
    assert KafkaNode(tmp_path, jvm_options=CLUSTER_JVM_OPTIONS).jvm_options == CLUSTER_JVM_OPTIONS
    monkeypatch.delenv(JVM_OPTIONS_ENV)
    assert KafkaNode(tmp_path).jvm_options == JVM_OPTIONS
    monkeypatch.setenv(JVM_OPTIONS_ENV, "")
    assert KafkaNode(tmp_path).jvm_options == JVM_OPTIONS


def test_the_variable_is_no_kafka_client_setting() -> None:
    """KwalConfig reads KWAL_KAFKA_* as client settings: the knob's name stays out of it."""
    cfg = KwalConfig.load(environ={JVM_OPTIONS_ENV: "-Xmx99m"})
    assert not any("jvm" in key for key in cfg.kafka), cfg.kafka
    assert KwalConfig.load(environ={"KWAL_KAFKA_JVM_OPTIONS": "x"}).kafka["jvm.options"] == "x"
