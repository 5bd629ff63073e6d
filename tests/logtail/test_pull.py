"""Pull (seed 001): a CN that starts after checkpoints and logtail truncation bootstraps
from the newest checkpoint manifest, follows each topic from the offsets recorded
there, and agrees with the TN; one whose position was truncated away bootstraps again.
On the real broker, with the object store on the local folder and on the S3 API."""

from __future__ import annotations

import random

import pytest
from confluent_kafka import Consumer, TopicPartition

from consumers.core.cn import CN
from consumers.core.exceptions import BelowHorizonError
from infra import capabilities
from infra.config import KwalConfig
from tests.logtail.conftest import Tn, checkpoint_then_compact, random_steps
from tn.checkpoint.manifest import newest_manifest
from tn.memtable.block import BLOCK_ROWS


def test_late_cn_bootstraps_after_checkpoints_and_truncation(tn: Tn, kwal_config: KwalConfig) -> None:
    """Checkpoints (one after a compaction) and logtail truncation happen before the CN
    starts. It starts from the newest manifest: its horizon is that checkpoint's ts, it
    follows every topic from the offsets recorded there (none below), and at every ts
    from the horizon to its watermark its snapshot equals the TN's."""
    rng = random.Random(11)
    stamps: list[int] = []
    first = checkpoint_then_compact(tn, rng, 40, stamps)
    random_steps(tn, rng, 40, stamps)
    second = tn.checkpoint()
    random_steps(tn, rng, 40, stamps)
    # The first two checkpoints may find records not yet acknowledged (offsets are then
    # lower bounds, possibly 0); before the third, everything so far is acknowledged.
    assert tn.logtail.publisher.flush(30), tn.logtail.publisher.errors
    third = tn.checkpoint()
    random_steps(tn, rng, 30, stamps)  # after the last checkpoint: only in the logtail
    final = tn.engine.heartbeat().result(10)
    assert tn.logtail.publisher.flush(30), tn.logtail.publisher.errors

    # the manifests record where each topic is to be followed from, and those only grow
    topics = {kwal_config.topics.catalog, kwal_config.topics.logtail("db", "a"), kwal_config.topics.logtail("db", "b")}
    assert topics <= set(third.logtail_offsets)
    for topic in topics:
        offsets = [m.logtail_offsets.get(topic, 0) for m in (first, second, third)]
        assert offsets == sorted(offsets) and offsets[-1] > 0, (topic, offsets)
    # truncated behind the previous checkpoint: physically where the broker can, else logically
    features = capabilities.probe_one(kwal_config, "delete_records")
    if features.works:
        assert tn.truncator.deleted_before == second.logtail_offsets
        # (0 where the second checkpoint found none of db.a's records acknowledged yet)
        topic_a = kwal_config.topics.logtail("db", "a")
        assert _low_watermark(kwal_config, topic_a) == second.logtail_offsets.get(topic_a, 0)
    else:
        assert tn.truncator.deleted_before == {}
        assert "logical only" in tn.truncator.note

    newest = newest_manifest(tn.store)
    assert newest is not None and newest.ts == third.ts
    cn = CN(kwal_config, ["db.a", "db.b"], tn.store).start()
    try:
        assert cn.horizon == third.ts
        assert cn.started_from == {t: third.logtail_offsets[t] for t in cn.started_from}
        assert set(cn.started_from) == topics
        assert cn.wait_for(final, timeout_s=30), (cn.watermark(), cn.errors)
        checked = 0
        for ts in [*stamps, final]:
            for name in ("a", "b"):
                if ts < third.ts:
                    with pytest.raises(BelowHorizonError):
                        cn.snapshot(f"db.{name}", ts)
                    continue
                expected = tn.engine.read("db", name, ts).to_pylist()
                assert cn.snapshot(f"db.{name}", ts).to_pylist() == expected, (name, ts)
                checked += 1
        assert checked >= 60
        assert cn.snapshot("db.a", final).num_rows > BLOCK_ROWS  # the compacted block, from objects
        assert cn.errors == []
    finally:
        cn.close()


def _low_watermark(cfg: KwalConfig, topic: str) -> int:
    c = Consumer(cfg.kafka_client(**{"group.id": "low-watermark"}))
    try:
        low, _high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(low)
    finally:
        c.close()


def test_cn_whose_position_was_truncated_away_bootstraps_again(tn: Tn, kwal_config: KwalConfig) -> None:
    """A CN that reads from offset 0 after the logtail was physically truncated meets the
    gap, bootstraps from the newest checkpoint (its watermark moving forward, never
    back) and agrees with the TN. Needs a broker with DeleteRecords."""
    probe = capabilities.probe_one(kwal_config, "delete_records")
    if not probe.works:
        pytest.skip(f"the broker lacks DeleteRecords (kwal doctor: {probe.detail})")
    rng = random.Random(5)
    stamps: list[int] = []
    tn.create("a", "b")
    random_steps(tn, rng, 30, stamps)
    assert tn.logtail.publisher.flush(30), tn.logtail.publisher.errors
    tn.checkpoint()
    random_steps(tn, rng, 30, stamps)
    last = tn.checkpoint()  # truncates below the first checkpoint's offsets
    random_steps(tn, rng, 20, stamps)
    final = tn.engine.heartbeat().result(10)
    assert tn.logtail.publisher.flush(30), tn.logtail.publisher.errors
    marks: list[int] = []
    cn = CN(kwal_config, ["db.a", "db.b"], tn.store, bootstrap=False)
    cn.on_watermark = marks.append
    cn.start()
    try:
        assert cn.wait_for(final, timeout_s=30), (cn.watermark(), cn.errors)
        assert cn.bootstraps == 1 and cn.horizon == last.ts
        assert marks == sorted(marks)
        for name in ("a", "b"):
            assert cn.snapshot(f"db.{name}", final).to_pylist() == tn.engine.read("db", name, final).to_pylist()
        assert cn.errors == []
    finally:
        cn.close()
