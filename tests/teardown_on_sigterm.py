"""A pytest plugin: SIGTERM ends a test run the way Ctrl-C does, with its teardown.

Why: the servers a run starts (brokers, the S3 server) live in sessions of their own
(`infra.processes.start_server`), so nothing stops them but the fixtures' finalizers and
`pytest_unconfigure`. Python's default SIGTERM ends the process at once, skipping both:
a CI job cancelled or timed out left its Java brokers running. With this plugin:

1. the first SIGTERM raises KeyboardInterrupt in the main thread, which pytest turns
   into an interrupted run that still finalizes its fixtures and unconfigures (under
   pytest-xdist each worker and the controller get the signal and do so);
2. the handler puts SIGTERM's default back first, so a second SIGTERM (a teardown
   that hangs) ends the process as before;
3. when the run unconfigures, it stops every server this process started that is still
   running (`infra.processes.started_here`): the interruption can land between a
   server's start and the finalizer that would stop it (a fixture still setting up).
   `start_server` itself stops a server whose readiness wait was interrupted.

Loaded by tests/conftest.py (`pytest_plugins`); `-p tests.teardown_on_sigterm` loads it
into any other run.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import pytest


def _interrupt(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # handlers can only be set from the main thread; a run embedded in a thread keeps
    # the default
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    from infra.processes import started_here

    for server in started_here():
        print(f"stopping {server.name} (pid {server.pid}), still running as the run ends")
        server.stop(timeout_s=10)
