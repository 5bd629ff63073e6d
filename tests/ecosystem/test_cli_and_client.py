"""The reader's rough edges of issue 34 (item 5): `kwal cn query` without `--ts` answers at
the CN's watermark, and a `Client` given a config that names no Kafka address finds the
running `kwal up` stack the way the command line does."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from infra.config import KwalConfig
from infra.stack import STATE_FILE, StackState, apply_stack
from infra.topics import ensure_topics
from ops import cli
from producers import Client
from tn.engine import Engine
from tn.logstore.driver import LogStore
from tn.logstore.memory_backend import MemoryDriver
from tn.logtail.wiring import attach_logtail


def test_cn_query_without_ts_answers_at_the_watermark(
    kwal_config: KwalConfig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = kwal_config
    cfg.tn.heartbeat_ms = 20
    ensure_topics(cfg)
    engine = Engine(LogStore(MemoryDriver()))
    logtail = attach_logtail(engine, cfg)
    try:
        t = engine.begin()
        t.create_database("db")
        t.create_table("db", "t", [("id", "int64"), ("v", "string")], "id")
        t.commit().result(10)
        last = 0
        for i in range(6):
            t = engine.begin()
            t.insert("db", "t", [{"id": i, "v": "a"}])
            if i >= 2:
                t.delete("db", "t", [i - 2])
            last = t.commit().result(10)
        assert logtail.publisher.flush(20)
        for name, value in cfg.to_env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("KWAL_CONFIG", "/dev/null")
        capsys.readouterr()
        assert cli.main(["cn", "query", "--table", "db.t", "--json", "--timeout", "30"]) == 0
        out, err = capsys.readouterr()
        ts = int(err.rsplit("as of ts ", 1)[1].rstrip(")\n"))
        assert ts >= last  # every commit acknowledged before the query is in its answer
        got = [json.loads(line) for line in out.splitlines()]
        assert got == engine.read("db", "t", ts).to_pylist()
        assert got == [{"id": 4, "v": "a"}, {"id": 5, "v": "a"}]
        # a table that does not exist is named in a clear error, after the catalog is read
        assert cli.main(["cn", "query", "--table", "db.nope", "--timeout", "30"]) == 1
        assert "db.nope does not exist" in capsys.readouterr().err
    finally:
        logtail.close()
        engine.close()


def _write_stack_state(state_dir: Path, broker_address: str) -> None:
    state = StackState(
        broker_pid=0, broker_address=broker_address, broker_storage="", s3_pid=0,
        s3_endpoint="http://127.0.0.1:1", log_dir=str(state_dir), broker="kafka",
    )
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / STATE_FILE).write_text(json.dumps(asdict(state)))


def test_client_finds_the_running_stack(
    kafka_bootstrap: str, kwal_config: KwalConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_topics(kwal_config)  # the results topic the client reads, on the session broker
    monkeypatch.chdir(tmp_path)
    _write_stack_state(tmp_path / ".kwal", kafka_bootstrap)  # `kwal up`'s file, default state dir
    cfg = KwalConfig.load(environ={})  # what the README's example does: no address anywhere
    assert cfg.bootstrap != kafka_bootstrap
    cfg.topics.prefix = kwal_config.topics.prefix
    with Client(cfg, "script", start_timeout_s=20) as client:
        assert client.cfg.bootstrap == kafka_bootstrap
    # an address named in code, a file or the environment is kept
    named = cfg.with_bootstrap("127.0.0.1:1")
    assert apply_stack(named, named.bootstrap_explicit).bootstrap == "127.0.0.1:1"
    from_env = KwalConfig.load(environ={"KWAL_BOOTSTRAP": "127.0.0.1:2"})
    assert apply_stack(from_env, from_env.bootstrap_explicit).bootstrap == "127.0.0.1:2"
