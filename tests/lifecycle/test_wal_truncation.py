"""Issue 25, 3a: after a checkpoint the WAL truncation is physical, never past an entry
above the logical truncation point, and replay after it rebuilds the same state.

On Apache Kafka (DeleteRecords works): each WAL partition's log-start offset
(ListOffsets earliest) moves to the first record holding an entry above the
checkpoint's LSN, and a new TN (driver + recovery from the same topics and object
store) reads each partition from there and answers every read as before.
"""

from __future__ import annotations

from infra.config import KwalConfig
from infra.objectstore import S3Store
from tests.checkpoint.helpers import create, delete, insert, reads, update
from tests.lifecycle.conftest import starts
from tn.checkpoint.recovery import recover
from tn.checkpoint.runner import CheckpointRunner
from tn.engine import Engine
from tn.logstore.driver import LogStore
from tn.logstore.kafka_backend import KafkaDriver
from tn.logstore.kafka_backend.replay import RecordInfo


def _check_prefix(
    known: dict[tuple[int, int], RecordInfo], start: dict[int, int], point: int
) -> None:
    """Never past an entry above the point; and as far as seed 004's rule allows."""
    for (p, off), info in known.items():
        if off < start[p]:
            assert info.max_lsn <= point, (p, off, info, point)
    for p, off in start.items():
        first_kept = known.get((p, off))
        if first_kept is not None:
            assert first_kept.max_lsn > point, (p, off, first_kept, point)


def test_checkpoints_move_the_log_start_and_replay_rebuilds_the_state(
    lc_config: KwalConfig, s3_store: S3Store
) -> None:
    cfg = lc_config
    cfg.topics.wal_partitions = 2
    driver = KafkaDriver(cfg)
    log = LogStore(driver)
    assert driver.truncation_mode == "physical"
    eng = Engine(log)
    runner = CheckpointRunner(eng, s3_store)
    topic, parts = cfg.topics.wal, driver.partitions
    ts = [create(eng)] + [insert(eng, i * 40, i * 40 + 40) for i in range(6)]
    ts.append(delete(eng, [3, 50]))
    before = starts(cfg, topic, parts)
    assert before == {0: 0, 1: 0}
    known: dict[tuple[int, int], RecordInfo] = {}
    points = []
    for rnd in range(2):
        known.update({(i.partition, i.offset): i for i in driver.records_map()})
        m = runner.checkpoint()
        assert m is not None and driver.truncated() == m.lsn
        points.append(m.lsn)
        after = starts(cfg, topic, parts)
        known.update({(i.partition, i.offset): i for i in driver.records_map()})
        assert all(after[p] >= before[p] for p in parts)
        assert any(after[p] > before[p] for p in parts), (rnd, before, after)
        _check_prefix(known, after, m.lsn)
        before = after
        ts += [update(eng, [5 + rnd], f"u{rnd}"), insert(eng, 1000 + rnd * 10, 1010 + rnd * 10)]
    assert points[1] > points[0]
    ts.append(delete(eng, [6, 1001]))
    expected = reads(eng, ts)
    last = log.next_lsn() - 1
    runner.stop()
    eng.close()
    log.close()
    # replay: a new TN on the same topics and object store
    driver2 = KafkaDriver(cfg)
    log2 = LogStore(driver2)
    rec = recover(log2, s3_store)
    try:
        assert rec.manifest is not None and rec.manifest.lsn == points[1]
        assert driver2.truncated() == points[1]
        assert driver2.replay_start == before  # where the truncation record says, not 0
        assert rec.replayed == last - points[1]
        assert reads(rec.engine, ts) == expected
        assert starts(cfg, topic, parts) == before  # a restart deletes nothing more
    finally:
        rec.engine.close()
        log2.close()
