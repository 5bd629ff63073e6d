"""Heartbeats stay out of the topics' long-term retention (issue 34, item 3).

The catalog and table topics are compacted, heartbeats share one key and every other
record has its own (infra.topics, tn.logtail.publisher step 6): once the broker's log
cleaner has run, a topic keeps every change record and few heartbeats, and both CNs
(Python and Spark) reading the compacted topics from their first records still reach
the TN's watermark and agree with it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from consumers.core.cn import CN
from consumers.spark.job import start_query
from consumers.spark.reader import read_state, watermark
from infra.config import KwalConfig
from infra.objectstore import FolderStore
from schemas.logtail import HEARTBEAT_KEY, Changes, Heartbeat, decode_logtail
from tests.logtail.conftest import Tn, start_tn
from tests.spark.helpers import spark_rows, tn_rows

pytestmark = pytest.mark.spark


def _read_all(cfg: KwalConfig, topic: str) -> list[tuple[int, bytes, Any]]:
    """(offset, key, record) of every record the topic holds now, from its first."""
    c = Consumer(cfg.kafka_client(**{"group.id": "hb-test", "enable.auto.commit": False,
                                     "enable.partition.eof": True}))
    try:
        _low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[tuple[int, bytes, Any]] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error() is not None:
                if (m.offset() or 0) >= high:
                    return out
                continue
            out.append((m.offset() or 0, m.key() or b"", decode_logtail(m.value() or b"")))
            if (m.offset() or 0) + 1 >= high:
                return out
        raise AssertionError(f"{topic}: did not read up to offset {high} within 20 s")
    finally:
        c.close()


def test_compacted_topics_keep_every_change_and_both_cns_still_advance(
    spark: Any, kwal_config: KwalConfig, tmp_path: Path
) -> None:
    cfg = kwal_config
    cfg.topics.logtail_segment_ms = 300  # segments roll often: the cleaner gets to work
    tn = start_tn(cfg, FolderStore(tmp_path / "objects"))  # heartbeats every 20 ms
    try:
        _check(spark, cfg, tn, tmp_path)
    finally:
        tn.close()


def _check(spark: Any, cfg: KwalConfig, tn: Tn, tmp_path: Path) -> None:
    changes_ts = [tn.create("a", "idle")]
    for i in range(6):
        changes_ts.append(tn.commit(lambda t, i=i: t.insert("db", "a", [{"id": i, "v": "x"}])))
    changes_ts.append(tn.commit(lambda t: t.update("db", "a", [{"id": 1, "v": "y"}])))
    changes_ts.append(tn.commit(lambda t: t.delete("db", "a", [2])))
    idle = cfg.topics.logtail("db", "idle")
    # wait, bounded, until the cleaner removed most of the idle table's heartbeats
    deadline = time.monotonic() + 40
    while True:
        assert tn.logtail.publisher.flush(10)
        records = _read_all(cfg, idle)
        written = records[-1][0] + 1 if records else 0
        if written >= 60 and len(records) * 2 < written:
            break
        assert time.monotonic() < deadline, (len(records), written)
        time.sleep(0.3)
    final = tn.engine.heartbeat().result(10)
    assert tn.logtail.publisher.flush(10)
    if tn.logtail.heartbeater is not None:  # no more heartbeats: the topics stay as cleaned
        tn.logtail.heartbeater.close()

    # every record but a heartbeat has a key of its own; every change of db.a is kept
    a_records = _read_all(cfg, cfg.topics.logtail("db", "a"))
    keys = [k for _, k, r in a_records if not isinstance(r.body, Heartbeat)]
    assert len(keys) == len(set(keys)) and HEARTBEAT_KEY not in keys
    assert all(k == HEARTBEAT_KEY for _, k, r in a_records if isinstance(r.body, Heartbeat))
    assert [r.commit_ts for _, _, r in a_records if isinstance(r.body, Changes)] == changes_ts[1:]
    assert max(r.commit_ts for _, _, r in _read_all(cfg, idle)) >= final

    # the Python CN, from the first records of the compacted topics
    cn = CN(cfg, ["db.a", "db.idle"]).start()
    try:
        assert cn.wait_for(final, timeout_s=30), cn.errors
        assert cn.watermark("db.idle") >= final
        for name in ("a", "idle"):
            got = sorted(cn.snapshot(f"db.{name}", final).to_pylist(), key=lambda r: r["id"])
            assert got == tn_rows(tn, name, final), name
    finally:
        cn.close()

    # the Spark CN, likewise
    output = tmp_path / "out"
    topics = {t: cfg.topics.logtail(*t.split(".", 1)) for t in ("db.a", "db.idle")}
    q = start_query(spark, cfg.bootstrap, cfg.topics.catalog, topics, output,
                    trigger="available-now", from_checkpoint="never", compact_interval_s=0.0)
    try:
        assert q.awaitTermination(180), "the query did not finish"
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
    assert watermark(output, "db.idle") >= final
    assert watermark(output) >= final
    assert spark_rows(read_state(spark, output, "db.a")) == tn_rows(tn, "a", final)
