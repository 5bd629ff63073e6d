"""The TN as a subprocess (`python -m tn.service.main`), for the kill -9 harness
and the commit benchmark: start (waits for its ready line), SIGKILL, SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from infra.config import KwalConfig
from infra.processes import REPO, child_env

PASS_ENV = ("KWAL_FETCH_WAIT_MS",)  # tuning knobs that are not config settings


class TnProcess:
    """`python -m tn.service.main` with the config given, as a subprocess."""

    def __init__(self, cfg: KwalConfig, workdir: Path) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def env(self) -> dict[str, str]:
        env = child_env(self.cfg, keep=PASS_ENV)
        env["KWAL_WAL_DIR"] = str(Path(self.cfg.wal.dir).resolve())
        return env

    def start(self, timeout_s: float = 60.0) -> None:
        self.starts += 1
        log_path = self.workdir / f"tn-{self.starts}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tn.service.main"],
            cwd=REPO,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if b"kwal-tn ready" in log_path.read_bytes():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        tail = log_path.read_bytes()[-3000:].decode(errors="replace")
        self.kill()
        raise RuntimeError(f"TN did not become ready (see {log_path}):\n{tail}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None

    def terminate(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self.proc = None
        return rc
