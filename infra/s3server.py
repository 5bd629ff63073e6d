"""A real S3 API on loopback: moto's server mode, run as a child process.

Used by the tests, `kwal up` and the demo. Its data lives in the process's
memory: it survives broker restarts (the broker's `s3://` storage), not its own.
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

from infra.processes import ServerProcess, free_port, start_server

ACCESS_KEY = "kwal"
SECRET_KEY = "kwal-secret"


def s3_ready(endpoint: str) -> bool:
    with urllib.request.urlopen(endpoint + "/moto-api/", timeout=1) as resp:  # noqa: S310 - loopback
        return bool(resp.status == 200)


def start_s3_server(log_dir: Path, port: int | None = None, timeout_s: float = 30.0) -> ServerProcess:
    port = port or free_port()
    address = f"127.0.0.1:{port}"
    endpoint = f"http://{address}"
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    return start_server(
        "S3 server (moto)",
        argv,
        address,
        log_dir / f"s3-{port}.log",
        ready=lambda: s3_ready(endpoint),
        timeout_s=timeout_s,
    )


def s3_endpoint(server: ServerProcess) -> str:
    return f"http://{server.address}"
