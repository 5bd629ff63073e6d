"""SIGTERM to a test run stops the servers it started (tests/teardown_on_sigterm.py).

An inner pytest run starts a server the way the suite's fixtures do
(`infra.processes.start_server`, a session of its own) and blocks: in a test (the
fixture holds the server), in the server's readiness wait (nobody holds it yet), or in
the fixture after the start, before its finalizer exists. The outer test SIGTERMs it and
checks whether the server outlived the run. Without the plugin it does -- the case the
plugin exists for, kept here as the control that shows the check can fail."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from infra.processes import pid_alive, stop_pid
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]

INNER_CONFTEST = '''
import os
import sys
import threading
from pathlib import Path

import pytest

from infra.processes import start_server

OUT = Path(os.environ["KWAL_SIGTERM_OUT"])


WHERE = os.environ["KWAL_SIGTERM_WHERE"]
SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(300)"


def ready():
    if WHERE == "starting":
        (OUT / "running").touch()
        return False  # the run is terminated in this wait
    return True


@pytest.fixture(scope="session")
def server():
    s = start_server(
        "sleeper",
        [sys.executable, "-c", SLEEPER, str(OUT / "pid")],
        "none",
        OUT / "sleeper.log",
        ready=ready,
        timeout_s=120,
    )
    if WHERE == "set_up":
        (OUT / "running").touch()
        threading.Event().wait(120)  # terminated before the finalizer below exists
    yield s
    s.stop()
'''

INNER_TEST = '''
import threading

from conftest import OUT


def test_blocks_until_terminated(server):
    (OUT / "running").touch()
    threading.Event().wait(120)  # the outer test ends this run with SIGTERM
'''


@pytest.mark.parametrize(
    ("where", "with_plugin"),
    [("in_test", True), ("starting", True), ("set_up", True), ("in_test", False)],
    ids=["plugin", "plugin-while-starting", "plugin-while-setting-up", "control"],
)
def test_sigterm_ends_a_run_with_its_servers_stopped(
    tmp_path: Path, where: str, with_plugin: bool
) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "pytest.ini").write_text("[pytest]\n")
    (inner / "conftest.py").write_text(INNER_CONFTEST)
    (inner / "test_inner.py").write_text(INNER_TEST)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(inner / "pytest.ini")]
    if with_plugin:
        argv += ["-p", "tests.teardown_on_sigterm"]
    env = {
        **os.environ, "PYTHONPATH": str(REPO), "KWAL_SIGTERM_OUT": str(tmp_path),
        "KWAL_SIGTERM_WHERE": where,
    }
    proc = subprocess.Popen(
        [*argv, str(inner)], cwd=inner, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    pid: int | None = None
    try:
        wait_until("the inner run's test is running", lambda: (tmp_path / "running").exists() or proc.poll() is not None)
        assert proc.poll() is None, proc.communicate()[0].decode(errors="replace")
        wait_until("the server wrote its pid", lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text())
        pid = int((tmp_path / "pid").read_text())
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0].decode(errors="replace")
        if with_plugin:
            assert "KeyboardInterrupt" in out, out
            wait_until("the server the run started has stopped", lambda: not pid_alive(pid))
        else:
            assert proc.returncode == -signal.SIGTERM, out
            assert pid_alive(pid), "without the plugin the server was expected to outlive the run"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid is not None and pid_alive(pid):
            stop_pid(pid, timeout_s=5)
