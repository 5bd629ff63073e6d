"""`kwal bench commit` leaves no work directory behind when it completes, and keeps it
(naming it) when it fails: the TN's log is what tells why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.config import KwalConfig
from ops.bench import commit


def test_the_work_directory_is_removed_after_a_run_and_kept_after_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    made: list[Path] = []

    def mkdtemp(prefix: str) -> str:
        made.append(tmp_path / f"{prefix}{len(made)}")
        made[-1].mkdir()
        return str(made[-1])

    def completes(_args: Any, _cfg: KwalConfig, workdir: Path) -> int:
        (workdir / "tn-1.log").write_text("serving")
        return 0

    def fails(_args: Any, _cfg: KwalConfig, workdir: Path) -> int:
        (workdir / "tn-1.log").write_text("the TN stopped")
        raise RuntimeError("the TN stopped")

    monkeypatch.setattr(commit.tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(commit, "_run", completes)
    assert commit.run(object(), KwalConfig()) == 0
    assert not made[0].exists()

    monkeypatch.setattr(commit, "_run", fails)
    with pytest.raises(RuntimeError, match="the TN stopped"):
        commit.run(object(), KwalConfig())
    assert (made[1] / "tn-1.log").read_text() == "the TN stopped"
    assert str(made[1]) in capsys.readouterr().err
