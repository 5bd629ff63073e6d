"""Replication settings of kwal's topics (`topics.replication_factor`,
`topics.min_insync_replicas`) and the `kwal up --brokers 3` stack that sets them. The
cluster itself is exercised in tests/faults/test_cluster.py."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from infra.config import KwalConfig
from infra.stack import STATE_FILE, StackError, StackState, apply_stack, start_stack
from infra.topics import TopicError, core_topics, ensure_topics, replication


def test_replication_settings_no_write_could_meet_are_refused() -> None:
    cfg = KwalConfig.load(environ={})
    cfg.topics.replication_factor, cfg.topics.min_insync_replicas = 3, 2
    assert replication(cfg) == (3, {"min.insync.replicas": "2"})
    cfg.topics.min_insync_replicas = 0
    assert replication(cfg) == (3, {})  # the broker's own min.insync.replicas
    cfg.topics.min_insync_replicas = 4
    with pytest.raises(TopicError, match=r"min_insync_replicas=4 .*replication_factor=3"):
        replication(cfg)
    cfg.topics.replication_factor, cfg.topics.min_insync_replicas = 0, 0
    with pytest.raises(TopicError, match="replication_factor must be at least 1"):
        replication(cfg)


def test_an_existing_topic_with_fewer_replicas_than_configured_is_an_error(kwal_config: KwalConfig) -> None:
    ensure_topics(kwal_config)  # one broker: one replica each
    kwal_config.topics.replication_factor = 3
    with pytest.raises(TopicError, match=r"partitions with 1 replicas.*replication_factor=3"):
        ensure_topics(kwal_config, core_topics(kwal_config))


def _write_cluster_state(state_dir: Path) -> None:
    state = StackState(
        broker_pid=11, broker_address="127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", broker_storage="",
        s3_pid=0, s3_endpoint="http://127.0.0.1:4", log_dir=str(state_dir), broker="kafka",
        broker_pids=[11, 12, 13], replication_factor=3, min_insync_replicas=2,
    )
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / STATE_FILE).write_text(json.dumps(asdict(state)))


def test_commands_on_a_cluster_stack_replicate_as_it_was_started_for(tmp_path: Path) -> None:
    cfg = KwalConfig.load(environ={"KWAL_STACK_STATE_DIR": str(tmp_path)})
    _write_cluster_state(tmp_path)
    used = apply_stack(cfg, explicit_bootstrap=False)
    assert used.bootstrap == "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"
    assert (used.topics.replication_factor, used.topics.min_insync_replicas) == (3, 2)
    assert (cfg.topics.replication_factor, cfg.topics.min_insync_replicas) == (1, 0)  # not mutated
    # a config that sets replication itself keeps it
    own = KwalConfig.load(environ={"KWAL_STACK_STATE_DIR": str(tmp_path), "KWAL_TOPICS_REPLICATION_FACTOR": "2"})
    assert apply_stack(own, explicit_bootstrap=False).topics.replication_factor == 2


def test_a_cluster_of_the_embedded_broker_is_refused(tmp_path: Path) -> None:
    cfg = KwalConfig.load(environ={"KWAL_STACK_STATE_DIR": str(tmp_path)})
    with pytest.raises(StackError, match=r"--brokers 3 needs Apache Kafka \(--broker kafka\)"):
        start_stack(cfg, broker="tansu", brokers=3)
    assert not list(tmp_path.iterdir())  # refused before anything started
