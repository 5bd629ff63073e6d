"""`kwal up --secure` (its own broker: this module is about starting one): the stack's
broker accepts only its SCRAM users, kwal's ACLs are in place, and each principal gets a
private config file that works as that principal."""

from __future__ import annotations

import argparse
import stat
from pathlib import Path

import pytest

from infra import acls
from infra.brokers.secure import can_log_in
from infra.config import KwalConfig
from infra.stack import read_state, run_down, run_up


def test_up_secure_writes_working_private_configs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = KwalConfig.load(environ={})
    cfg.stack.state_dir = str(tmp_path / "state")
    cfg.topics.prefix = "kwal-up"
    cfg.security.services = "svc1"
    cfg.security.cns = "cn9"
    args = argparse.Namespace(broker="kafka", broker_storage="memory", secure=True)
    assert run_up(args, cfg) == 0
    try:
        assert "KWAL_CONFIG=" in capsys.readouterr().out
        state = read_state(cfg)
        assert state is not None
        files = {p.stem: p for p in (tmp_path / "state" / "secure").glob("*.toml")}
        assert set(files) == {"admin", "kwal-tn", "svc1", "cn9"}
        for path in files.values():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        svc = KwalConfig.load(files["svc1"])
        assert svc.security.enabled and svc.kafka["sasl.username"] == "svc1"
        assert svc.bootstrap == state.broker_address
        assert can_log_in(svc.kafka)
        assert not can_log_in({**svc.kafka, "sasl.password": "wrong"}, timeout_s=2)
        assert acls.check(KwalConfig.load(files["admin"])).clean
    finally:
        assert run_down(argparse.Namespace(), cfg) == 0
    assert read_state(cfg) is None
