"""`kwal bench logtail`'s latency phase on the session broker, at a small rate.

What it proves: every commit of the phase is seen by the CN process (none left
unresolved: the CN's start line and its watermark lines parse, and the outcome count
replaces the kept futures), the CPU figures of both processes are reported (and the
broker's, when the bench knows its process), and the engine's process keeps no WAL entry
per commit (the memory WAL was truncated behind the commits,
`ops.bench.logtail.TRUNCATE_EVERY`)."""

from __future__ import annotations

from infra.config import KwalConfig
from infra.processes import ServerProcess
from infra.topics import ensure_topics
from ops.bench.logtail import TRUNCATE_EVERY, _latency_phase, _RemoteCN
from tn.engine import Engine
from tn.logstore.driver import LogStore
from tn.logstore.memory_backend import MemoryDriver
from tn.logtail.wiring import attach_logtail


def test_latency_phase_resolves_every_commit_and_keeps_no_wal_entries(
    kwal_config: KwalConfig, embedded_broker: ServerProcess | None
) -> None:
    cfg = kwal_config
    ensure_topics(cfg)
    driver = MemoryDriver()
    engine = Engine(LogStore(driver))
    logtail = attach_logtail(engine, cfg)
    try:
        t = engine.begin()
        t.create_database("bench")
        t.create_table("bench", "t", [("id", "int64"), ("v", "string")], "id")
        t.commit().result(30)
        cn = _RemoteCN(cfg, "bench.t")
        try:
            assert cn.wait_for(engine.visible_ts, timeout_s=60)
            # the phase runs for 0.5 s whatever the rate reached; 2 truncations need
            # 2 * TRUNCATE_EVERY commits, so the rate asks for 4x that
            broker_pid = embedded_broker.pid if embedded_broker is not None else None
            phase = _latency_phase(
                engine, cn, 4 * 2 * TRUNCATE_EVERY, 0.5, first_id=1, broker_pid=broker_pid
            )
        finally:
            cn.close()
        assert phase["achieved_tps"] > 0, phase
        assert phase["unresolved"] == 0, phase
        assert phase["tn_cpu_us_per_commit"] > 0, phase
        if broker_pid is not None:  # a session broker this run started (not an external one)
            assert phase["broker_cpu_us_per_commit"] > 0, phase
            assert 0 <= phase["broker_jit_cpu_us_per_commit"] <= phase["broker_cpu_us_per_commit"], phase
        else:
            assert "broker_cpu_us_per_commit" not in phase, phase
        # at most one truncation interval of entries is ever held (+ the DDL entry)
        assert driver.last_lsn() - driver.truncated() <= TRUNCATE_EVERY, phase
    finally:
        logtail.close()
        engine.close()
