"""Fault: a second TN takes over the WAL while the first still runs. The first is fenced
at its next append and exits with status 3 (`tn.service.main.FENCED_EXIT`) instead of
reopening the log, which would fence the second in turn."""

from __future__ import annotations

import time
from pathlib import Path

from infra.config import KwalConfig
from infra.topics import ensure_topics
from producers import Client
from tn.service.main import FENCED_EXIT
from tn.service.process import TnProcess


def test_a_fenced_tn_exits_instead_of_reopening(kwal_config: KwalConfig, tmp_path: Path) -> None:
    cfg = kwal_config
    cfg.wal.backend = "kafka"
    cfg.wal.dir = str(tmp_path / "wal")
    cfg.objectstore.url = f"file://{tmp_path / 'objects'}"
    ensure_topics(cfg)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = TnProcess(cfg, tmp_path / "a")
    second = TnProcess(cfg, tmp_path / "b")
    first.start(timeout_s=120)
    try:
        second.start(timeout_s=120)  # claims a newer epoch: the first is fenced
        assert first.proc is not None and second.proc is not None
        with Client(cfg, "fenced") as client:
            deadline = time.monotonic() + 60
            i = 0
            # both consume the requests topic; the first one's next append meets the fence
            while first.proc.poll() is None and time.monotonic() < deadline:
                t = client.begin()
                t.create_database(f"d{i}")
                try:
                    t.commit(timeout=5)
                except Exception:  # noqa: BLE001 - the fenced TN may answer first: aborted
                    pass
                i += 1
            assert first.proc.poll() == FENCED_EXIT, (tmp_path / "a" / "tn-1.log").read_text()[-3000:]
        log = (tmp_path / "a" / "tn-1.log").read_text()
        assert "fenced by a newer TN" in log
        assert "reopening it" not in log
        assert second.proc.poll() is None  # the newer TN still serves
    finally:
        first.kill()
        second.kill()
