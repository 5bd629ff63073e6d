"""Issue 25, 3c: a TN restart reads the WAL from the recorded truncation point, never from
offset 0; `kwal bench recovery` reports `restart_10x_vs_1x`."""

from __future__ import annotations

import argparse
import json

import pytest
from confluent_kafka.admin import AdminClient

from infra.config import KwalConfig
from infra.logsize import topic_size
from ops.bench import recovery as bench_recovery
from tn.logstore.driver import LogStore
from tn.logstore.kafka_backend import KafkaDriver


def test_a_restart_reads_from_the_recorded_truncation_point(lc_config: KwalConfig) -> None:
    cfg = lc_config
    cfg.topics.wal_partitions = 2
    # logical truncation: the records before the point stay in the topic, so only the
    # recorded offsets can keep a restart from reading them
    d = KafkaDriver(cfg, delete_records=False)
    try:
        store = LogStore(d)
        for i in range(1, 41):
            store.append(b"x%d" % i).result(10)  # one entry per record, across partitions
        d.truncate(30)
    finally:
        d.close()
    admin = AdminClient(cfg.kafka_client())
    held = {s.partition: s for s in topic_size(admin, cfg.topics.wal)}
    assert all(s.start == 0 for s in held.values())  # nothing deleted physically
    d2 = KafkaDriver(cfg, delete_records=False)
    try:
        assert d2.truncated() == 30 and d2.last_lsn() == 40
        assert all(d2.replay_start[p] > 0 for p in held)
        # exactly the records from the recorded offsets to the end were read; each is a
        # Kafka transaction of its own (docs/fencing.md): a record, then its commit marker
        assert 2 * d2.records_read == sum(s.end - d2.replay_start[p] for p, s in held.items())
        assert d2.replay_result.head_skipped == 0  # one entry per record: none <= 30 read
        assert sorted(d2.replay_result.entries) == list(range(31, 41))
    finally:
        d2.close()


def test_bench_recovery_reports_restart_10x_vs_1x(
    kwal_config: KwalConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(rows=1000, wal_entries=[20], history=20, tail=10, rounds=1)
    assert bench_recovery.run(args, kwal_config) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert "restart_10x_vs_1x" in result
    assert result["history_entries"] == 20 and result["tail_entries"] == 10
    # the machine's speed at both ends, to tell a slow machine from a slow change
    assert result["machine_loop_ms_start"] > 0 and result["machine_loop_ms_end"] > 0
