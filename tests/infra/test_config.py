from __future__ import annotations

from pathlib import Path

import pytest

from infra.config import ConfigError, KwalConfig


def test_defaults_are_the_embedded_stack() -> None:
    cfg = KwalConfig.load(environ={})
    assert cfg.wal.backend == "kafka"  # Kafka is the Log Service; `file` is asked for by name
    assert cfg.topics.wal == "kwal.wal"
    assert cfg.topics.logtail("db", "t") == "kwal.logtail.db.t"
    assert not cfg.bootstrap_explicit


def test_toml_then_env_override(tmp_path: Path) -> None:
    toml = tmp_path / "kwal.toml"
    toml.write_text(
        '[kafka]\n"bootstrap.servers" = "k1:9093"\n"security.protocol" = "SASL_SSL"\n'
        '[wal]\nbackend = "kafka"\nwindow = 64\n[tn]\nheartbeat_ms = 20\n'
    )
    env = {"KWAL_WAL_WINDOW": "128", "KWAL_KAFKA_SASL_USERNAME": "alice"}
    cfg = KwalConfig.load(toml, environ=env)
    assert cfg.wal.backend == "kafka"
    assert cfg.wal.window == 128  # env beats the file
    assert cfg.tn.heartbeat_ms == 20
    client = cfg.kafka_client(**{"group.id": "g"})
    assert client["bootstrap.servers"] == "k1:9093"
    assert client["security.protocol"] == "SASL_SSL"  # passed through untouched
    assert client["sasl.username"] == "alice"
    assert client["group.id"] == "g"
    assert cfg.bootstrap_explicit


def test_bad_values_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="KWAL_WAL_WINDOW"):
        KwalConfig.load(environ={"KWAL_WAL_WINDOW": "lots"})
    toml = tmp_path / "bad.toml"
    toml.write_text("[wal]\nnope = 1\n")
    with pytest.raises(ConfigError, match="wal.nope"):
        KwalConfig.load(toml, environ={})
    toml.write_text("[nosuch]\nx = 1\n")
    with pytest.raises(ConfigError, match=r"unknown section \[nosuch\]"):
        KwalConfig.load(toml, environ={})


def test_to_env_round_trips(tmp_path: Path) -> None:
    cfg = KwalConfig.load(environ={"KWAL_WAL_WINDOW": "77", "KWAL_KAFKA_SASL_USERNAME": "bob"})
    cfg.tn.heartbeat_ms = 15
    cfg.objectstore.url = "s3://b/p"
    back = KwalConfig.load(environ=cfg.to_env())
    assert back.wal.window == 77
    assert back.tn.heartbeat_ms == 15
    assert back.objectstore.url == "s3://b/p"
    assert back.kafka_client()["sasl.username"] == "bob"


def test_change_stream_settings_from_the_environment() -> None:
    """A section whose name holds "_" (change_stream) is found by its whole name."""
    from infra.config import ConfigError, KwalConfig

    cfg = KwalConfig.load(environ={"KWAL_CHANGE_STREAM_TABLES": "shop.orders, shop.stock",
                                   "KWAL_CHANGE_STREAM_REGISTRY_URL": "http://127.0.0.1:1/x"})
    assert cfg.change_stream.table_list() == ["shop.orders", "shop.stock"]
    assert cfg.change_stream.active and cfg.change_stream.wants("shop.stock")
    assert not cfg.change_stream.wants("shop.other")
    assert cfg.change_stream.registry_url == "http://127.0.0.1:1/x"
    assert KwalConfig.load(environ=cfg.to_env()).change_stream == cfg.change_stream
    assert KwalConfig.load(environ={"KWAL_CHANGE_STREAM_ENABLED": "1"}).change_stream.wants("a.b")
    bad = KwalConfig.load(environ={"KWAL_CHANGE_STREAM_TABLES": "orders"})
    with pytest.raises(ConfigError, match="'orders' is not a db.table name"):
        bad.change_stream.table_list()
