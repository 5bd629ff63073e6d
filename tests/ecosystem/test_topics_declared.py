"""Every topic kwal uses is created by `infra.topics` with the partitions and configs it
declares; none is left to the broker's auto-creation (issue 34, item 4)."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

from consumers.core.cn import CN
from infra.config import KwalConfig
from infra.topics import TopicSpec, core_topics, logtail_topic
from producers import Client
from tn.service.process import TnProcess


def _described(admin: AdminClient, topics: list[str]) -> dict[str, dict[str, tuple[str, int]]]:
    """topic -> config name -> (value, source) as the broker reports them."""
    futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics])
    return {
        res.name: {k: (e.value, e.source) for k, e in fut.result(timeout=20).items()}
        for res, fut in futures.items()
    }


def _same(name: str, want: str, got: str) -> bool:
    if name == "cleanup.policy":  # a list: the broker may order it its own way
        return set(want.split(",")) == set(got.split(","))
    return want == got


def test_a_tn_cn_and_commits_use_only_topics_infra_declared(
    kwal_config: KwalConfig, tmp_path: Path
) -> None:
    cfg = kwal_config
    cfg.wal.backend = "kafka"
    cfg.topics.wal_partitions = 2
    cfg.topics.logtail_segment_ms = 123_456
    tn = TnProcess(cfg, tmp_path)
    tn.start()
    cn = None
    try:
        with Client(cfg, "topics") as client:
            t = client.begin()
            t.create_database("shop")
            t.create_table("shop.orders", [("id", "int64"), ("v", "string")], "id")
            t.create_table("shop.items", [("id", "int64")], "id")
            t.commit(timeout=30)
            cn = CN(cfg, ["shop.orders", "shop.items"]).start()
            for i in range(3):
                t = client.begin()
                t.insert("shop.orders", [{"id": i, "v": "x"}])
                last = t.commit(timeout=30)
            tn.kill()  # a restart: recovery and the republished logtail produce too
            tn.start()
            t = client.begin()
            t.insert("shop.items", [{"id": 1}])
            last = t.commit(timeout=30)
            assert cn.wait_for(last.commit_ts, timeout_s=30), cn.errors
    finally:
        if cn is not None:
            cn.close()
        tn.kill()

    expected: dict[str, TopicSpec] = {
        s.name: s
        for s in [
            *core_topics(cfg),
            logtail_topic(cfg, "shop", "orders"),
            logtail_topic(cfg, "shop", "items"),
        ]
    }
    admin = AdminClient(cfg.kafka_client())
    listed = admin.list_topics(timeout=20).topics
    ours = {name: md for name, md in listed.items() if name.startswith(cfg.topics.prefix + ".")}
    # no other topic (the TN's kwal_system tables have none: their changes are never pushed)
    assert sorted(ours) == sorted(expected)
    assert not [n for n in ours if "kwal_system" in n]
    configs = _described(admin, sorted(ours))
    for name, spec in expected.items():
        assert len(ours[name].partitions) == spec.partitions, name
        assert spec.config, f"{name}: declared without explicit settings"
        for key, want in spec.config.items():
            value, source = configs[name][key]
            assert _same(key, want, value), (name, key, want, value)
            # set on the topic when infra created it, not a broker default
            assert source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, (name, key, source)
    assert len(ours[cfg.topics.wal].partitions) == 2
    assert configs[cfg.topics.logtail("shop", "orders")]["segment.ms"][0] == "123456"
