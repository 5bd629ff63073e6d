"""Starting and stopping the background servers kwal runs itself.

Shared by the embedded broker and the loopback S3 server:
1. pick a free loopback port;
2. start the process with its output streamed to a log file, in its own
   process group, so a stop kills exactly what we started;
3. wait, bounded, until a readiness probe answers; if the process dies or the
   wait runs out, stop it and raise `ServerStartError` with the log's tail; if the
   wait is interrupted (Ctrl-C, a test run's SIGTERM), stop it and let the
   interruption through.

Every server started here is remembered (`started_here`): a process that must not
leave servers behind when it ends (a test run) stops what is still running.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infra.config import KwalConfig

REPO = Path(__file__).resolve().parents[1]


class ServerStartError(RuntimeError):
    """A background server did not become ready; the message carries its log's tail."""


def child_env(cfg: KwalConfig, keep: Sequence[str] = ()) -> dict[str, str]:
    """The environment of a kwal child process (`python -m ...` from this checkout) that
    must run with exactly `cfg`: the parent's environment without its `KWAL_*` settings
    (but the names in `keep`), `cfg` as `KWAL_*` variables, no config file, and this
    checkout importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KWAL_") or k in keep}
    env.update(cfg.to_env(), KWAL_CONFIG=os.devnull, PYTHONPATH=str(REPO))
    return env


SERVER_PORTS_FROM = 20000


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for a server started here: below the kernel's ephemeral
    range where it can (`/proc/sys/net/ipv4/ip_local_port_range`; else any free port).

    Why not any free port: a client left reconnecting to a server that was stopped (a
    fault test's broker, a proxy) keeps knocking on that port. Listeners that bind port 0,
    like Spark's callback for each Python worker it starts, take ports from the ephemeral
    range; one that took such a port would be reached by the stray client. A Spark worker
    start failed once in CI with "Authentication failed" from something connecting to
    that callback; this is the suspected cause, not a confirmed one."""
    low = _ephemeral_low()
    if low - SERVER_PORTS_FROM >= 1000:
        for _ in range(50):
            port = random.randrange(SERVER_PORTS_FROM, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue  # in use (or in TIME_WAIT): another one
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the ")" closing the command name (state is
    field 0, ppid 1, utime 11, stime 12, cutime 13, cstime 14); None where /proc does not
    tell (not Linux, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, every thread) process `pid` has used so far; None where
    /proc does not tell (not Linux, or the process is gone)."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ThreadsCpuMeter:
    """CPU seconds a process's threads picked by name (/proc's `comm`, 15 characters: a
    JVM's "C2 CompilerThre", say) have used, as its readings see them.

    Counted per thread, not as a sum over the threads alive at each reading: a JVM ends
    its idle compiler threads and starts new ones, and such a sum goes down when a thread
    ends between two readings (a CI run's bench printed -13.4 us of JIT CPU per commit).
    Each `read` adds what every thread (by id and start time) used since the previous
    reading saw it, and the whole of a thread that reading did not see. What a thread
    used after the last reading before it ended is lost with it (/proc forgets an ended
    thread): a lower bound, which never goes down. Differences between two readings are
    what the threads used in between."""

    def __init__(self, pid: int, name_prefixes: Sequence[str]) -> None:
        self.pid = pid
        self.name_prefixes = tuple(name_prefixes)
        self._last: dict[tuple[str, str], int] = {}  # (tid, start time) -> ticks, last reading
        self._ticks = 0

    def read(self) -> float | None:
        """CPU seconds so far (see the class docstring); None where /proc does not tell."""
        try:
            tids = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return None
        now: dict[tuple[str, str], int] = {}
        for tid in tids:
            try:
                with open(f"/proc/{self.pid}/task/{tid}/comm") as f:
                    name = f.read().strip()
            except OSError:
                continue  # the thread ended
            fields = _stat_fields(f"{self.pid}/task/{tid}") if name.startswith(self.name_prefixes) else None
            if fields is not None:  # start time: field 19 (clock ticks after boot)
                now[(tid, fields[19])] = int(fields[11]) + int(fields[12])
        self._ticks += sum(ticks - self._last.get(key, 0) for key, ticks in now.items())
        self._last = now
        return self._ticks / os.sysconf("SC_CLK_TCK")


def process_tree_cpu_s(root: int) -> float | None:
    """CPU seconds so far of `root` and every descendant alive now, each with the children
    it has reaped (a finished worker); None where /proc does not tell about `root`.
    Differences between two readings are what the tree spent in between."""
    stats: dict[int, tuple[int, int]] = {}  # pid -> (parent, ticks incl. reaped children)
    for entry in os.listdir("/proc"):
        fields = _stat_fields(entry) if entry.isdigit() else None
        if fields is not None:
            stats[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
    if root not in stats:
        return None
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in stats.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return sum(stats[p][1] for p in tree) / os.sysconf("SC_CLK_TCK")


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


@dataclass
class ServerProcess:
    name: str
    pid: int
    address: str  # host:port
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_alive(self.pid)

    def cpu_s(self) -> float | None:
        """CPU seconds (user + system) the process has used so far; None where /proc
        does not tell (not Linux, or the process is gone). For benchmarks: a server
        started here shares the machine's cores with the client measured beside it."""
        return process_cpu_s(self.pid)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL after `timeout_s`."""
        stop_pid(self.pid, timeout_s)
        if self.popen is not None:
            try:
                self.popen.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass

    def kill(self) -> None:
        """SIGKILL at once (for fault tests)."""
        _signal_group(self.pid, signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait(timeout=10)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still "exists"; reap it if we can.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_pid(pid: int, timeout_s: float = 10.0) -> None:
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.05)
    _signal_group(pid, signal.SIGKILL)


def start_server(
    name: str,
    argv: Sequence[str],
    address: str,
    log_path: Path,
    ready: Callable[[], bool],
    timeout_s: float,
    env: dict[str, str] | None = None,
) -> ServerProcess:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # unbuffered: a Python server's lines reach the log as written, so the log tail
            # a failed start reports holds its last words (not lost in a pipe buffer)
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,
        )
    server = ServerProcess(name, popen.pid, address, log_path, popen)
    _STARTED.append(server)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if popen.poll() is not None:
                raise ServerStartError(
                    f"{name} exited with code {popen.returncode} before answering on "
                    f"{address}; log {log_path}:\n{log_tail(log_path)}"
                )
            try:
                if ready():
                    return server
            except Exception:  # noqa: BLE001 - any failure of the probe means "not yet"
                pass
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"{name} did not answer on {address} within {timeout_s:.0f}s; "
                    f"log {log_path}:\n{log_tail(log_path)}"
                )
            time.sleep(0.1)
    except BaseException:
        # a start that failed, or was interrupted, leaves nothing running: no caller
        # holds the server yet to stop it
        server.stop(timeout_s=2)
        raise


# every server `start_server` started in this process (`started_here`)
_STARTED: list[ServerProcess] = []


def started_here() -> list[ServerProcess]:
    """The servers this process started that are still running."""
    _STARTED[:] = [s for s in _STARTED if s.alive()]
    return list(_STARTED)


def port_open(address: str, timeout_s: float = 0.5) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False
