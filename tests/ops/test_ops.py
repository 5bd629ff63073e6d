"""`kwal ops status / truncate / retention` on the real broker (embedded, or KWAL_TEST_BOOTSTRAP).

WAL contents are written with a real `KafkaDriver`, which is closed before any ops
command runs (ops commands never open one themselves).
"""

from __future__ import annotations

import json
import time
from argparse import Namespace
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from infra.config import KwalConfig
from infra.objectstore import open_store
from infra.topics import ensure_topics, logtail_topic
from ops import retention as ops_retention
from ops import status as ops_status
from ops import truncate as ops_truncate
from ops.walscan import scan_wal
from schemas.logtail import HEARTBEAT_KEY, Heartbeat, LogtailRecord, encode_logtail
from tests.waiting import wait_until
from tn.checkpoint.manifest import Manifest
from tn.logstore.driver import LogStore
from tn.logstore.kafka_backend import KafkaDriver
from tn.logstore.kafka_backend.retention import read_retention


@pytest.fixture
def cfg(kwal_config: KwalConfig) -> KwalConfig:
    kwal_config.wal.backend = "kafka"
    kwal_config.wal.append_timeout_s = 10.0
    return kwal_config


def write_entries(cfg: KwalConfig, n: int) -> None:
    d = KafkaDriver(cfg, delete_records=False)
    try:
        store = LogStore(d)
        start = d.last_lsn() + 1
        futures = [store.append(f"entry-{lsn}".encode()) for lsn in range(start, start + n)]
        assert [f.result(20) for f in futures] == list(range(start, start + n))
    finally:
        d.close()


def fake_checkpoint(cfg: KwalConfig, ts: int, lsn: int) -> None:
    m = Manifest(
        ts=ts,
        lsn=lsn,
        prev_ts=0,
        catalog="checkpoints/catalog/x.json",
        objects={"data/1/1-1.parquet": 1234},
        created_at=time.time(),
    )
    open_store(cfg.objectstore).put(m.key, m.encode())


def args(**kw: Any) -> Namespace:
    base: dict[str, Any] = {
        "json": True,
        "no_probe": True,
        "timeout": 10.0,
        "logical_only": True,
        "set": None,
        "set_ms": None,
        "set_bytes": None,
    }
    base.update(kw)
    return Namespace(**base)


def status_json(cfg: KwalConfig, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    rc = ops_status.run(args(), cfg)
    out = capsys.readouterr().out
    doc: dict[str, Any] = json.loads(out)
    assert rc == 0, doc["errors"]
    return doc


def set_wal_retention(cfg: KwalConfig, ms: int) -> None:
    admin = AdminClient(cfg.kafka_client())
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        cfg.topics.wal,
        incremental_configs=[
            ConfigEntry("retention.ms", str(ms), incremental_operation=AlterConfigOpType.SET)
        ],
    )
    try:
        admin.incremental_alter_configs([res])[res].result(timeout=10)
    except KafkaException as e:
        pytest.skip(f"the broker cannot alter topic configs: {e}")


def wal_retention_ms(cfg: KwalConfig) -> int:
    return read_retention(AdminClient(cfg.kafka_client()), cfg.topics.wal).ms


# -- status ------------------------------------------------------------------------------


def test_status_on_an_empty_cluster(cfg: KwalConfig, capsys: pytest.CaptureFixture[str]) -> None:
    doc = status_json(cfg, capsys)
    assert set(doc) >= {
        "bootstrap",
        "wal",
        "truncation",
        "window",
        "checkpoint",
        "consumers",
        "retention",
        "errors",
    }
    assert doc["wal"]["exists"] is False
    assert doc["checkpoint"] is None
    assert doc["window"] == {"available": False, "note": "n/a (TN not reporting)"}
    assert doc["consumers"] == [] and doc["retention"] == []
    assert doc["truncation"]["mode"] == "unknown"
    # the human screen too
    assert ops_status.run(args(json=False), cfg) == 0
    text = capsys.readouterr().out
    assert "does not exist yet" in text and "no checkpoint yet" in text
    assert "n/a (TN not reporting)" in text


def test_status_on_a_populated_wal(cfg: KwalConfig, capsys: pytest.CaptureFixture[str]) -> None:
    cfg.topics.wal_partitions = 2
    write_entries(cfg, 40)
    write_entries(cfg, 10)  # a second epoch
    doc = status_json(cfg, capsys)
    wal = doc["wal"]
    assert wal["exists"] and wal["epoch"] == 2 and wal["truncated"] == 0
    assert wal["log_end"] == 50 and wal["replay_error"] == ""
    assert [p["partition"] for p in wal["partitions"]] == [0, 1]
    held = sorted(
        lsn for p in wal["partitions"] for a, b in p["lsn_ranges"] for lsn in range(a, b + 1)
    )
    assert held == list(range(1, 51))
    for p in wal["partitions"]:
        assert p["end"] >= p["high_reported"] and p["markers"] == 2
        # each WAL record (epoch markers included) is a Kafka transaction of its own
        # (docs/fencing.md): the record, then its commit marker, which no read returns
        assert p["end"] - p["low"] == 2 * p["records"]
    assert doc["truncation"]["point"] == 0
    [ret] = doc["retention"]
    assert ret["topic"] == cfg.topics.wal and ret["kind"] == "wal"
    assert ret["safe"] is True and ret["ms"] == -1 and ret["bytes"] == -1
    assert "infos" not in wal and "computed" not in ret


def test_status_shows_cn_lag_and_the_checkpoint(
    cfg: KwalConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    from consumers.core.cn import CN

    ensure_topics(cfg)
    ensure_topics(cfg, [logtail_topic(cfg, "db", "t")])
    producer = Producer(cfg.kafka_client(**{"linger.ms": 0}))

    def heartbeats(first: int, n: int) -> None:
        for ts in range(first, first + n):
            producer.produce(  # the catalog topic is compacted: records need keys
                cfg.topics.catalog,
                encode_logtail(LogtailRecord("", "", ts, Heartbeat())),
                HEARTBEAT_KEY,
            )
        assert producer.flush(10) == 0

    heartbeats(1, 5)
    cn = CN(cfg, ["db.t"], name="ops", commit_interval_s=0.1).start()
    try:
        assert cn.wait_for(5, timeout_s=20)
        time.sleep(0.5)  # one periodic commit
    finally:
        cn.close()
    heartbeats(6, 3)
    fake_checkpoint(cfg, ts=7, lsn=0)
    doc = status_json(cfg, capsys)
    lag = [c for c in doc["consumers"] if c["topic"] == cfg.topics.catalog]
    assert lag == [
        {
            "group": f"{cfg.topics.prefix}.cn.ops",
            "topic": cfg.topics.catalog,
            "committed": 5,
            "end": 8,
            "lag": 3,
        }
    ]
    assert doc["checkpoint"]["ts"] == 7 and doc["checkpoint"]["bytes"] == 1234
    assert [r["topic"] for r in doc["retention"]] == [cfg.topics.wal, cfg.topics.logtail("db", "t")]
    assert all(r["safe"] for r in doc["retention"])


# -- retention ---------------------------------------------------------------------------


def test_retention_check_fails_on_unsafe_and_passes_on_safe(
    cfg: KwalConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    write_entries(cfg, 20)
    assert ops_retention.run(args(), cfg) == 0  # -1: safe
    # below the floor the checkpoint schedule needs (2 x (60 s interval + 60 s headroom)),
    # though the entries are younger than it: the ones written in the next interval count too
    # (and it is long enough that the broker deletes nothing while the test runs)
    set_wal_retention(cfg, 60_000)
    assert ops_retention.run(args(), cfg) == 1
    out = capsys.readouterr().out
    assert "UNSAFE" in out and "retention.ms=60000" in out
    assert "tn.checkpoint_interval_s=60" in out and "retention.ms > 240000" in out
    set_wal_retention(cfg, 7 * 24 * 3600 * 1000)
    assert ops_retention.run(args(), cfg) == 0
    set_wal_retention(cfg, -1)
    assert ops_retention.run(args(), cfg) == 0


def test_retention_set_refuses_unsafe_and_applies_safe(
    cfg: KwalConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    write_entries(cfg, 20)
    ensure_topics(cfg, [logtail_topic(cfg, "db", "t")])
    capsys.readouterr()
    assert ops_retention.run(args(set="ms=1000"), cfg) == 1
    err = capsys.readouterr().err
    assert "refused" in err and "safe minimum now: retention.ms >=" in err
    assert wal_retention_ms(cfg) == -1
    set_wal_retention(cfg, -1)  # skips here when the broker cannot alter configs
    day = 24 * 3600 * 1000
    assert ops_retention.run(args(set_ms=day), cfg) == 0
    assert wal_retention_ms(cfg) == day
    admin = AdminClient(cfg.kafka_client())
    assert read_retention(admin, cfg.topics.logtail("db", "t")).ms == day
    assert ops_retention.run(args(set="ms=-1,bytes=-1"), cfg) == 0
    assert read_retention(admin, cfg.topics.wal) == read_retention(admin, cfg.topics.wal).__class__(
        -1, -1
    )
    with pytest.raises(Exception, match="ms=<int>"):
        ops_retention.parse_set("hours=3", None, None)


# -- truncate ----------------------------------------------------------------------------


def test_truncate_refuses_without_a_checkpoint(
    cfg: KwalConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    write_entries(cfg, 5)
    capsys.readouterr()
    assert ops_truncate.run(args(), cfg) == 1
    assert "no checkpoint" in capsys.readouterr().err
    assert scan_wal(cfg).truncated == 0


def test_truncate_to_the_last_checkpoint(
    cfg: KwalConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg.topics.wal_partitions = 2
    write_entries(cfg, 20)
    # a checkpoint claiming more than the WAL holds is refused
    fake_checkpoint(cfg, ts=1, lsn=100)
    assert ops_truncate.run(args(), cfg) == 1
    assert "only through 20" in capsys.readouterr().err
    fake_checkpoint(cfg, ts=2, lsn=12)
    assert ops_truncate.run(args(), cfg) == 0
    assert "0 -> 12" in capsys.readouterr().out
    assert scan_wal(cfg).truncated == 12
    # never backwards: an older-LSN checkpoint is a no-op
    fake_checkpoint(cfg, ts=3, lsn=5)
    assert ops_truncate.run(args(), cfg) == 0
    assert "already truncated to 12" in capsys.readouterr().out
    # a reopened driver (the next writer) sees the point and replays only 13..20
    d = KafkaDriver(cfg, delete_records=False)
    try:
        assert d.truncated() == 12
        assert sorted(d.replay_result.entries) == list(range(13, 21))
        assert d.replay_result.entries[13] == b"entry-13"
    finally:
        d.close()
    doc = status_json(cfg, capsys)
    assert doc["truncation"]["point"] == 12 and doc["wal"]["log_end"] == 20
    # with the probe, the mode is the broker's, and a logical one names both logs
    capsys.readouterr()
    assert ops_status.run(args(no_probe=False), cfg) == 0
    tr = json.loads(capsys.readouterr().out)["truncation"]
    if tr["mode"] == "logical":
        assert "WAL and of the logtail topics is logical only" in tr["detail"], tr
    else:
        assert tr["mode"] == "physical", tr


def test_truncate_deletes_prefixes_where_the_broker_can(
    cfg: KwalConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra import capabilities

    works = capabilities.probe(cfg).delete_records
    if not works.works:
        pytest.skip(f"the broker lacks DeleteRecords (kwal doctor: {works.detail})")
    write_entries(cfg, 10)
    write_entries(cfg, 10)  # two epochs: records 1..10, marker, 11..20
    fake_checkpoint(cfg, ts=2, lsn=10)
    assert ops_truncate.run(args(logical_only=False), cfg) == 0
    assert "deleted partition 0" in capsys.readouterr().out
    scan = scan_wal(cfg)
    assert scan.truncated == 10 and scan.partitions[0].low > 0
    assert scan.partitions[0].first_lsn == 11 and scan.log_end == 20


def test_the_tn_status_record_shows_the_window(
    cfg: KwalConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    from tn.service.status_publisher import StatusPublisher

    write_entries(cfg, 3)
    d = KafkaDriver(cfg, delete_records=False)
    try:
        # pretend 6 entries are in flight
        pub = StatusPublisher(cfg, lambda: {**d.status(), "last_lsn": 9, "window": 64}, 0.2)
        pub.start()
        time.sleep(0.5)
        pub.stop()
        assert pub.failures == 0
        doc = status_json(cfg, capsys)
    finally:
        d.close()
    w = doc["window"]
    assert w["available"] and w["in_flight"] == 6 and w["acked_lsn"] == 3 and w["limit"] == 64
    assert w["epoch"] == 2 and w["stale"] is False
    # the status record is ignored by the meta protocol: the next writer opens normally
    d = KafkaDriver(cfg, delete_records=False)
    try:
        assert d.last_lsn() == 3
    finally:
        d.close()


def test_unreachable_kafka_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = KwalConfig.load(environ={}).with_bootstrap("127.0.0.1:1")
    t0 = time.monotonic()
    for command in (ops_status, ops_truncate, ops_retention):
        assert command.run(args(timeout=1.0), cfg) == 2
        err = capsys.readouterr().err.strip()
        assert "Kafka is unreachable at 127.0.0.1:1" in err and "\n" not in err
    assert time.monotonic() - t0 < 15


def test_the_kwal_ops_command_line(
    cfg: KwalConfig, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ops import cli

    monkeypatch.setenv("KWAL_TOPICS_PREFIX", cfg.topics.prefix)
    monkeypatch.setenv("KWAL_OBJECTSTORE_URL", cfg.objectstore.url)
    monkeypatch.delenv("KWAL_CONFIG", raising=False)
    write_entries(cfg, 3)
    base = ["--bootstrap", cfg.bootstrap, "ops"]
    capsys.readouterr()
    assert cli.main([*base, "status", "--json", "--no-probe"]) == 0
    assert json.loads(capsys.readouterr().out)["wal"]["log_end"] == 3
    assert cli.main([*base, "retention", "--check"]) == 0
    assert cli.main([*base, "truncate", "--logical-only"]) == 1  # no checkpoint
    fake_checkpoint(cfg, ts=1, lsn=2)
    assert cli.main([*base, "truncate", "--logical-only"]) == 0
    assert scan_wal(cfg).truncated == 2


def test_recording_a_lower_point_keeps_the_newest_record_at_the_maximum(cfg: KwalConfig) -> None:
    """A writer recorded 15 after ops scanned (saw less) and before ops records 12: the point
    stays 15, and the newest `truncated` record (what compaction keeps) is 15 again."""
    from infra.topic_scan import read_to_end

    ensure_topics(cfg)
    producer = Producer(cfg.kafka_client())
    producer.produce(cfg.topics.wal_meta, b'{"lsn": 15}', key=b"truncated", partition=0)
    assert producer.flush(10) == 0
    assert ops_truncate.record_truncation(cfg, 12, 10.0) == 15
    values: list[bytes] = []
    read_to_end(
        cfg,
        cfg.topics.wal_meta,
        [0],
        lambda m: values.append(m.value() or b"") if m.key() == b"truncated" else None,
        10.0,
    )
    assert [json.loads(v)["lsn"] for v in values] == [15, 12, 15]
    assert scan_wal(cfg).truncated == 15


def test_doctor_deletes_old_retention_probe_topics_and_keeps_recent_ones(cfg: KwalConfig) -> None:
    """The retention probe leaves its topic behind (deleting it at once can race Kafka's
    segment deletion); the next run deletes such leftovers once they are old."""
    from confluent_kafka.admin import NewTopic

    from infra import capabilities

    now = int(time.time())
    old = f"{cfg.topics.prefix}.doctor-{now - capabilities.LEFTOVER_AGE_S - 60}-0a0b0c0d.ret"
    recent = f"{cfg.topics.prefix}.doctor-{now - 5}-0e0f0a0b.ret"
    other = f"{cfg.topics.prefix}.doctor-{now - capabilities.LEFTOVER_AGE_S - 60}-0a0b0c0d.del"
    admin = AdminClient(cfg.kafka_client())
    for fut in admin.create_topics([NewTopic(t, 1, 1) for t in (old, recent, other)]).values():
        fut.result(timeout=30)
    prober = capabilities._Prober(cfg, timeout_s=10)
    assert prober._old_leftovers() == [old]
    prober._cleanup()

    def topics() -> set[str]:
        return set(admin.list_topics(timeout=10).topics)

    wait_until(f"{old} deleted", lambda: old not in topics())
    assert {recent, other} <= topics()
