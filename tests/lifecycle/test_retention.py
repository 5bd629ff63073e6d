"""Issue 25, 3b: retention on a broker that deletes.

- the broker really deletes WAL and logtail segments by `retention.ms`, once
  `kwal ops retention --set` accepted it (nothing needed is older);
- `kwal ops retention` refuses settings below what replay or a bootstrapping CN
  needs, naming the setting and why, and calls out a WAL that already lost entries
  (which a new writer refuses to replay: never silently);
- a checkpoint that stalls (the object store unreachable) while retention comes due
  loses no acknowledged entry: the TN's retention floor raises the WAL topic's
  retention.ms in time (a control topic with the operator's setting is emptied by
  the broker meanwhile, so retention did come due).
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from infra.config import KwalConfig, ObjectStoreConfig
from infra.objectstore import S3Store, open_store
from infra.processes import free_port
from infra.topics import TopicSpec, alter_topic_configs, ensure_topics, logtail_topic
from ops import retention as ops_retention
from tests.checkpoint.helpers import create, insert, reads
from tests.lifecycle.conftest import starts
from tests.waiting import wait_until
from tn.checkpoint.manifest import Manifest
from tn.checkpoint.recovery import recover
from tn.checkpoint.runner import CheckpointRunner
from tn.engine import Engine
from tn.logstore.driver import LogStore
from tn.logstore.kafka_backend import KafkaDriver
from tn.logstore.kafka_backend.exceptions import AcknowledgedEntryLostError
from tn.logstore.kafka_backend.retention import read_retention


def _args(**kw: Any) -> argparse.Namespace:
    base: dict[str, Any] = {"check": False, "set": None, "set_ms": None, "set_bytes": None}
    base.update(kw)
    return argparse.Namespace(timeout=10.0, **base)


def _write(cfg: KwalConfig, n: int, truncate: bool = False) -> int:
    """n entries through a real writer (closed after); truncate (logically) behind them."""
    d = KafkaDriver(cfg, delete_records=False)
    try:
        store = LogStore(d)
        futs = [store.append(b"e%d" % i) for i in range(n)]
        last = futs[-1].result(20)
        if truncate:
            d.truncate(last)
        return last
    finally:
        d.close()


def _produce(cfg: KwalConfig, topic: str, n: int) -> None:
    p = Producer(cfg.kafka_client(acks="all", **{"linger.ms": 0}))
    for i in range(n):
        p.produce(topic, value=b"r%d" % i, partition=0)
    assert p.flush(10) == 0


def _end(cfg: KwalConfig, topic: str) -> int:
    from infra.logsize import topic_size

    return topic_size(AdminClient(cfg.kafka_client()), topic)[0].end


def test_the_broker_deletes_wal_and_logtail_segments_by_retention(
    lc_config: KwalConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = lc_config
    cfg.tn.checkpoint_interval_s = 0.5  # the schedule's floor: WAL 2 x (0.5 + 0.5) s,
    cfg.wal.retention_headroom_s = 0.5  # logtail 2 x 2 x 0.5 s
    last = _write(cfg, 20, truncate=True)  # logical truncation: only retention deletes
    lt = logtail_topic(cfg, "db", "t")
    ensure_topics(cfg, [lt])
    _produce(cfg, lt.name, 5)
    m = Manifest(ts=1, lsn=last, prev_ts=0, catalog="c", logtail_offsets={lt.name: 5})
    open_store(cfg.objectstore).put(m.key, m.encode())  # a CN bootstraps from offset 5
    assert starts(cfg, cfg.topics.wal, [0]) == {0: 0}
    assert ops_retention.run(_args(set_ms=2500), cfg) == 0
    assert "set retention.ms=2500 on wal topic" in capsys.readouterr().out
    wal_end, lt_end = _end(cfg, cfg.topics.wal), _end(cfg, lt.name)
    wait_until(
        "retention.ms deletes the WAL's truncated records and the logtail's old ones",
        lambda: starts(cfg, cfg.topics.wal, [0])[0] == wal_end
        and starts(cfg, lt.name, [0])[0] == lt_end,
    )
    d = KafkaDriver(cfg, delete_records=False)  # nothing needed was deleted: it opens
    try:
        assert d.truncated() == last and d.last_lsn() == last
    finally:
        d.close()
    assert ops_retention.run(_args(check=True), cfg) == 0


def test_retention_settings_that_could_delete_needed_records_are_refused(
    lc_config: KwalConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = lc_config  # the default schedule: checkpoints every 60 s
    _write(cfg, 10)
    ensure_topics(cfg, [logtail_topic(cfg, "db", "t")])
    capsys.readouterr()
    assert ops_retention.run(_args(set_ms=30_000), cfg) == 1
    err = capsys.readouterr().err
    assert "refused" in err and "wal topic" in err and "retention.ms=30000" in err
    assert "tn.checkpoint_interval_s=60" in err  # why: entries wait for a checkpoint
    assert "logtail topic" in err and "bootstrapping CN" in err
    assert ops_retention.run(_args(set_bytes=1 << 20), cfg) == 1
    assert "retention.bytes=1048576" in capsys.readouterr().err
    admin = AdminClient(cfg.kafka_client())
    assert read_retention(admin, cfg.topics.wal).ms == -1  # nothing was applied
    # an operator who sets it anyway (the admin API): --check fails, naming it
    alter_topic_configs(admin, [cfg.topics.wal], {"retention.ms": 30_000})
    assert ops_retention.run(_args(check=True), cfg) == 1
    assert "UNSAFE" in capsys.readouterr().out


def test_entries_deleted_by_retention_are_never_replayed_silently(
    lc_config: KwalConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = lc_config
    cfg.wal.retention_floor_check_s = 0  # no TN protecting them: the unsafe case
    _write(cfg, 10)
    _write(cfg, 5)  # epoch 2 recovered 1..10 (its base), then wrote 11..15
    admin = AdminClient(cfg.kafka_client())
    end = _end(cfg, cfg.topics.wal)
    alter_topic_configs(admin, [cfg.topics.wal], {"retention.ms": 500})
    wait_until("retention deletes every WAL record", lambda: starts(cfg, cfg.topics.wal, [0])[0] == end)
    with pytest.raises(AcknowledgedEntryLostError, match="recovered the log through LSN 10"):
        KafkaDriver(cfg, delete_records=False)
    capsys.readouterr()
    assert ops_retention.run(_args(check=True), cfg) == 1
    assert "already misses entries" in capsys.readouterr().out


def test_a_stalled_checkpoint_loses_nothing_while_retention_comes_due(
    lc_config: KwalConfig, s3_store: S3Store
) -> None:
    cfg = lc_config
    cfg.wal.retention_floor_check_s = 0.2
    cfg.wal.retention_headroom_s = 1.0
    operator = {"retention.ms": "3000", "segment.ms": "200"}
    control = cfg.topics.name("control")
    ensure_topics(
        cfg,
        [
            TopicSpec(cfg.topics.wal, 1, {"cleanup.policy": "delete", "retention.bytes": "-1", **operator}),
            TopicSpec(cfg.topics.wal_meta, 1, {"cleanup.policy": "compact"}),
            TopicSpec(control, 1, {"cleanup.policy": "delete", **operator}),
        ],
    )
    # the object store is down: nothing listens on its port
    down = ObjectStoreConfig(
        url="s3://stalled/kwal", endpoint_url=f"http://127.0.0.1:{free_port()}",
        access_key_id="x", secret_access_key="y",
    )
    driver = KafkaDriver(cfg, retention_policy="warn")
    log = LogStore(driver)
    eng = Engine(log)
    runner = CheckpointRunner(eng, S3Store("stalled", "kwal", down), interval_s=0.3).start()
    try:
        ts = [create(eng), insert(eng, 0, 50), insert(eng, 50, 60)]
        # younger than every WAL record so far: once the broker deleted it, retention came
        # due for every WAL segment too, had its retention stayed the operator's
        _produce(cfg, control, 1)
        wait_until("the broker deletes the control topic's record (retention came due)",
                 lambda: starts(cfg, control, [0])[0] == 1)
        wait_until("a checkpoint attempt failed", lambda: bool(runner.errors))
        assert driver.truncated() == 0  # no checkpoint: nothing may be deleted
        # retention may take the opening marker's segment, never one holding an entry
        first_entry = min(i.offset for i in driver.records_map() if i.max_lsn > 0)
        assert starts(cfg, cfg.topics.wal, [0])[0] <= first_entry
        floor = driver.retention_floor
        assert floor is not None and floor.raises >= 1 and floor.operator == {"retention.ms": 3000}
        assert read_retention(AdminClient(cfg.kafka_client()), cfg.topics.wal).ms > 3000
        ts.append(insert(eng, 60, 70))
        expected = reads(eng, ts)
        last = log.next_lsn() - 1
    finally:
        runner.stop()
        eng.close()
        log.close()
    # every acknowledged entry is still there: a new TN (no checkpoint) replays them all
    log2 = LogStore(KafkaDriver(cfg, retention_policy="warn"))
    rec = recover(log2, s3_store)
    try:
        assert rec.manifest is None and rec.replayed == last
        assert reads(rec.engine, ts) == expected
    finally:
        rec.engine.close()
        log2.close()


def test_the_retention_floor_raises_and_gives_back_the_operators_value(
    lc_config: KwalConfig,
) -> None:
    """The floor's decisions on a real topic, with what is needed given directly: raised
    to twice (age + headroom) while an entry is that old, the operator's value back once
    nothing needed is (checkpoints caught up); -1 is never touched."""
    from tn.logstore.kafka_backend.retention import SafeRetention
    from tn.logstore.kafka_backend.retention_floor import RetentionFloor

    cfg = lc_config
    topic = cfg.topics.name("floor")
    ensure_topics(cfg, [TopicSpec(topic, 1, {"retention.ms": "3000", "retention.bytes": "-1"})])
    admin = AdminClient(cfg.kafka_client())
    needed = [SafeRetention(0, 0, 2500, {0: 100})]  # an entry 2.5 s old above the point
    floor = RetentionFloor(
        admin, topic, lambda: needed[0], check_s=1.0, headroom_ms=1000, headroom_bytes=1 << 20
    )
    assert floor.check() == {"retention.ms": 7000}  # 2 x (2500 + 1000); bytes stay -1
    assert read_retention(admin, topic).ms == 7000
    assert floor.operator == {"retention.ms": 3000} and floor.raises == 1
    assert floor.check() == {}  # 7000 > 2500 + 1000: nothing to do
    needed[0] = SafeRetention(0, 0, 0, {})  # checkpointed: nothing needed
    assert floor.check() == {"retention.ms": 3000}
    assert read_retention(admin, topic).ms == 3000 and floor.operator == {}
    assert floor.alarm == ""
