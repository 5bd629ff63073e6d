"""Checkpoint + recovery on the Kafka WAL backend and the real S3 API (moto server)."""

from __future__ import annotations

from infra.config import KwalConfig
from infra.objectstore import S3Store
from tests.checkpoint.helpers import create, delete, insert, reads, update
from tn.checkpoint.recovery import recover
from tn.checkpoint.runner import CheckpointRunner
from tn.engine import Engine
from tn.logstore.driver import LogStore
from tn.logstore.kafka_backend import KafkaDriver
from tn.memtable.block import BLOCK_ROWS


def _open(cfg: KwalConfig) -> LogStore:
    return LogStore(KafkaDriver(cfg, retention_policy="warn"))


def test_kafka_wal_checkpoint_truncation_and_recovery(kwal_config: KwalConfig, s3_store: S3Store):
    log = _open(kwal_config)
    eng = Engine(log)
    runner = CheckpointRunner(eng, s3_store)
    ts = [create(eng), insert(eng, 0, BLOCK_ROWS + 10), delete(eng, [4])]
    m1 = runner.checkpoint()
    assert m1 is not None and log.truncated() == m1.lsn  # logical where the broker can't delete
    ts += [update(eng, [5], "a"), insert(eng, 90_000, 90_020)]
    m2 = runner.checkpoint()
    assert m2 is not None and log.truncated() == m2.lsn > m1.lsn
    ts.append(delete(eng, [6, 90_001]))
    expected = reads(eng, ts)
    eng.close()
    log.close()

    log2 = _open(kwal_config)
    rec = recover(log2, s3_store)
    try:
        assert rec.manifest is not None and rec.manifest.ts == m2.ts
        assert rec.replayed == 2  # the second checkpoint's FLUSH entry + the last delete
        assert reads(rec.engine, ts) == expected
    finally:
        rec.engine.close()
        log2.close()
