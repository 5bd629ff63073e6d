"""TN -> logtail topics -> CN, on the real broker."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

import consumers.core.cn as cn_module
from consumers.core.cn import CN
from infra.config import KwalConfig
from infra.topics import ensure_topics
from schemas.logtail import Changes, decode_logtail
from tests.delivery import NoOffset
from tests.logtail.conftest import random_txn
from tests.stalled_reader import StalledReader
from tn.engine import Engine
from tn.logstore.driver import LogStore
from tn.logstore.memory_backend import MemoryDriver
from tn.logtail.publisher import LogtailPublisher
from tn.logtail.wiring import attach_logtail


@pytest.fixture
def tn(kwal_config: KwalConfig):  # type: ignore[no-untyped-def]
    ensure_topics(kwal_config)
    kwal_config.tn.heartbeat_ms = 20
    engine = Engine(LogStore(MemoryDriver()))
    logtail = attach_logtail(engine, kwal_config)
    yield engine, logtail.publisher
    logtail.close()
    engine.close()


def test_cn_follows_tn_at_every_commit_ts(tn, kwal_config: KwalConfig) -> None:  # type: ignore[no-untyped-def]
    engine, pub = tn
    t = engine.begin()
    t.create_database("db")
    t.create_table("db", "t", [("id", "int64"), ("v", "string")], "id")
    stamps = [t.commit().result(10)]
    for i in range(20):
        t = engine.begin()
        t.insert("db", "t", [{"id": i, "v": f"v{i}"}, {"id": 100 + i, "v": "x"}])
        if i % 3 == 0 and i:
            t.delete("db", "t", [i - 1])
        if i % 4 == 0 and i:
            t.update("db", "t", [{"id": 100 + i - 1, "v": "updated"}])
        stamps.append(t.commit().result(10))
    assert pub.flush(20), pub.errors
    cn = CN(kwal_config, ["db.t"]).start()
    try:
        assert cn.wait_for(stamps[-1], timeout_s=30), (cn.watermark(), cn.errors)
        for ts in stamps[1:]:
            assert cn.snapshot("db.t", ts).to_pylist() == engine.read("db", "t", ts).to_pylist(), ts
        assert cn.errors == []
    finally:
        cn.close()


def test_idle_table_watermark_advances_by_heartbeats(tn, kwal_config: KwalConfig) -> None:  # type: ignore[no-untyped-def]
    engine, pub = tn
    t = engine.begin()
    t.create_database("db")
    t.create_table("db", "idle", [("id", "int64")], "id")
    t.create_table("db", "busy", [("id", "int64")], "id")
    t.commit().result(10)
    t = engine.begin()
    t.insert("db", "idle", [{"id": 1}])
    last_idle_commit = t.commit().result(10)
    cn = CN(kwal_config, ["db.idle", "db.busy"]).start()
    try:
        for i in range(5):  # only the other table changes from now on
            t = engine.begin()
            t.insert("db", "busy", [{"id": i}])
            t.commit().result(10)
        target = engine.heartbeat().result(10)
        assert cn.wait_for(target, "db.idle", timeout_s=20), cn.watermark("db.idle")
        assert cn.watermark("db.idle") > last_idle_commit
        assert cn.snapshot("db.idle", target).to_pylist() == [{"id": 1}]
        # each table's topic is read on its own: db.busy's mark reaches `target` in its
        # own time (seen in CI: db.idle at target, db.busy a heartbeat behind)
        assert cn.wait_for(target, "db.busy", timeout_s=20), cn.watermark("db.busy")
        assert cn.snapshot("db.busy", target).num_rows == 5
    finally:
        cn.close()


def test_random_workload_cn_equals_tn_at_every_ts(tn, kwal_config: KwalConfig) -> None:  # type: ignore[no-untyped-def]
    """Seeded random DML + drop/recreate/alter: the CN's snapshot equals the TN's at every
    commit ts up to its watermark, and a second CN reading everything again agrees."""
    import random

    engine, pub = tn
    rng = random.Random(7)
    t = engine.begin()
    t.create_database("db")
    for name in ("a", "b"):
        t.create_table("db", name, [("id", "int64"), ("v", "string")], "id")
    t.commit().result(10)
    stamps: list[int] = []
    for step in range(150):
        ts = random_txn(engine, rng, step, keys=40, alter=0.05, timeout_s=10)
        if ts is not None:
            stamps.append(ts)
    final = engine.heartbeat().result(10)
    cns = [CN(kwal_config, ["db.a", "db.b"]).start() for _ in range(2)]
    try:
        for cn in cns:
            assert cn.wait_for(final, timeout_s=30), (cn.watermark(), cn.errors)
            for ts in [*stamps, final]:
                for name in ("a", "b"):
                    expected = engine.read("db", name, ts).to_pylist()
                    assert cn.snapshot(f"db.{name}", ts).to_pylist() == expected, (name, ts)
            assert cn.errors == []
    finally:
        for cn in cns:
            cn.close()


def test_a_record_acknowledged_without_an_offset_is_produced_again_outside_the_callback(
    tn: Any, kwal_config: KwalConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first data record of db.again gets a delivery report without an offset (the
    embedded broker's duplicate-sequence answer after a restart). The publisher produces it
    again, never from inside a delivery callback, and `flush` returns only once the copy is
    delivered: the topic then holds the record twice, and a CN agrees with the TN."""
    engine, pub = tn
    topic = kwal_config.topics.logtail("db", "again")
    hidden: list[int] = []
    in_callback = threading.local()
    produced_in_callback: list[str] = []
    real_delivered = LogtailPublisher._delivered
    real_produce = LogtailPublisher._produce_value

    def delivered(self: LogtailPublisher, err: Any, msg: Any) -> None:
        if err is None and not hidden and msg.topic() == topic:
            value = decode_logtail(msg.value())
            if isinstance(value.body, Changes):
                hidden.append(int(msg.offset()))
                msg = NoOffset(msg)
        in_callback.on = True
        try:
            real_delivered(self, err, msg)
        finally:
            in_callback.on = False

    def produce(self: LogtailPublisher, t: str, key: bytes, value: bytes) -> None:
        if getattr(in_callback, "on", False):
            produced_in_callback.append(t)
        real_produce(self, t, key, value)

    monkeypatch.setattr(LogtailPublisher, "_delivered", delivered)
    monkeypatch.setattr(LogtailPublisher, "_produce_value", produce)
    t = engine.begin()
    t.create_database("db")
    t.create_table("db", "again", [("id", "int64"), ("v", "string")], "id")
    t.commit().result(10)
    t = engine.begin()
    t.insert("db", "again", [{"id": 1, "v": "one"}])
    ts = t.commit().result(10)
    assert pub.flush(20), pub.errors
    assert len(hidden) == 1
    assert produced_in_callback == []

    c = Consumer(kwal_config.kafka_client(**{"group.id": "again", "enable.partition.eof": True}))
    c.assign([TopicPartition(topic, 0, 0)])
    changes: list[int] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error() is not None:
            break  # end of partition: everything flushed is there
        if isinstance(decode_logtail(m.value() or b"").body, Changes):
            changes.append(m.offset() or 0)
    c.close()
    assert len(changes) == 2 and hidden[0] in changes  # the record and its copy

    cn = CN(kwal_config, ["db.again"]).start()
    try:
        assert cn.wait_for(ts, timeout_s=30), (cn.watermark(), cn.errors)
        assert cn.snapshot("db.again", ts).to_pylist() == engine.read("db", "again", ts).to_pylist()
    finally:
        cn.close()


def test_a_logtail_reader_that_stopped_fetching_is_assigned_again(
    tn, kwal_config: KwalConfig, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    """A CN's logtail reader stops fetching with records waiting (librdkafka after a
    broker restart; here: its real consumer's partitions paused under it, on the CN's own
    thread): after cn.logtail_stall_s the CN assigns its topics again at its positions
    and reaches the newest commit (without the check its watermark stays put), with every
    row once."""
    engine, pub = tn
    kwal_config.cn.logtail_stall_s = 1.0
    t = engine.begin()
    t.create_database("db")
    t.create_table("db", "s", [("id", "int64"), ("v", "string")], "id")
    t.commit().result(10)
    cn = CN(kwal_config, ["db.s"]).start()
    reader = StalledReader(monkeypatch, cn_module, "logtail")
    try:
        t = engine.begin()
        t.insert("db", "s", [{"id": 1, "v": "a"}])
        first = t.commit().result(10)
        assert cn.wait_for(first, timeout_s=30), (cn.watermark(), cn.errors)
        before = reader.reassigned()
        reader.stall()
        t = engine.begin()
        t.insert("db", "s", [{"id": 2, "v": "b"}])
        second = t.commit().result(10)
        assert pub.flush(20), pub.errors
        assert cn.wait_for(second, timeout_s=30), (cn.watermark(), cn.errors)
        assert cn.snapshot("db.s").to_pylist() == engine.read("db", "s").to_pylist()
        assert len(cn.snapshot("db.s")) == 2
        assert reader.reassigned() >= before + 1
        assert cn.errors == []
    finally:
        cn.close()
