"""`kwal up` / `kwal down` / `kwal status`: the embedded stack for local use.

`up` starts the loopback S3 server (moto) and a broker (Apache Kafka by
default, `--broker tansu` for the embedded one) in the background, and the schema
registry (infra.registry) when the change stream is enabled (`change_stream.enabled` or
`.tables`) and no `change_stream.registry_url` is set, and writes `<state_dir>/stack.json` with their PIDs and addresses;
`down` stops exactly the PIDs that file names (after checking each is still
the process `up` started, by its command line) and removes the file. While a
stack is up, commands that were given no Kafka address or object store use the
stack's (see `apply_stack`).
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from infra.brokers.local import DEFAULT_BROKER, check_broker
from infra.config import KwalConfig, ObjectStoreConfig
from infra.processes import ServerProcess, ServerStartError, pid_alive, port_open, stop_pid
from infra.s3server import ACCESS_KEY, SECRET_KEY, start_s3_server

STATE_FILE = "stack.json"
STACK_BUCKET = "kwal"


@dataclass
class StackState:
    broker_pid: int
    broker_address: str
    broker_storage: str
    s3_pid: int
    s3_endpoint: str
    log_dir: str
    broker: str = "tansu"  # state files written before Apache Kafka was the default name none
    registry_pid: int = 0  # the schema registry of the change stream (0: none started)
    registry_url: str = ""

    @property
    def broker_marker(self) -> str:
        """What the broker's command line contains (guards against a reused PID)."""
        return "kafka.Kafka" if self.broker == "kafka" else "tansu"

    @property
    def object_store(self) -> ObjectStoreConfig:
        return ObjectStoreConfig(
            url=f"s3://{STACK_BUCKET}/data",
            endpoint_url=self.s3_endpoint,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
        )


def state_path(cfg: KwalConfig) -> Path:
    return Path(cfg.stack.state_dir) / STATE_FILE


def read_state(cfg: KwalConfig) -> StackState | None:
    path = state_path(cfg)
    if not path.exists():
        return None
    try:
        return StackState(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        return None


def apply_stack(cfg: KwalConfig, explicit_bootstrap: bool) -> KwalConfig:
    """Point a config at the running stack unless it names a Kafka address itself."""
    state = read_state(cfg)
    if state is None or explicit_bootstrap:
        return cfg
    cfg = cfg.with_bootstrap(state.broker_address)
    if cfg.objectstore.url == ObjectStoreConfig().url:
        cfg.objectstore = state.object_store
    if state.registry_url and not cfg.change_stream.registry_url:
        cfg.change_stream.registry_url = state.registry_url
    return cfg


def _pid_is_ours(pid: int, marker: str) -> bool:
    """True when `pid` is alive and its command line contains `marker` (guards PID reuse)."""
    if not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return True  # no /proc: trust the PID
    return marker in cmdline


def start_stack(
    cfg: KwalConfig, storage: str = "memory", broker: str = DEFAULT_BROKER, secure: bool = False
) -> StackState:
    """Start the S3 server and the broker (the S3 server first: tansu's `s3` storage
    needs it). Apache Kafka keeps its data in `<state_dir>/kafka`, fresh each `up`;
    `storage` chooses tansu's (memory, or a bucket on the S3 server). `secure`: Apache
    Kafka with SASL/SCRAM over TLS and kwal's ACLs (infra.secure_stack)."""
    check_broker(broker)
    if secure and broker != "kafka":
        raise ServerStartError("--secure needs Apache Kafka (tansu has no SASL and no ACLs)")
    state_dir = Path(cfg.stack.state_dir)
    log_dir = state_dir / "logs"
    s3 = start_s3_server(log_dir, timeout_s=cfg.stack.start_timeout_s)
    endpoint = f"http://{s3.address}"
    try:
        if broker == "kafka":
            from infra.brokers.apache_kafka import start_kafka

            kafka_dir = state_dir / "kafka"
            shutil.rmtree(kafka_dir, ignore_errors=True)
            if secure:
                from infra.secure_stack import start_secure

                process, _ = start_secure(cfg, kafka_dir, max(cfg.stack.start_timeout_s, 120.0))
            else:
                process = start_kafka(kafka_dir, timeout_s=max(cfg.stack.start_timeout_s, 120.0))
            broker_storage = str(kafka_dir / "data")
        else:
            process, broker_storage = _start_tansu(log_dir, storage, endpoint, cfg.stack.start_timeout_s)
    except BaseException:
        s3.stop()
        raise
    state = StackState(process.pid, process.address, broker_storage, s3.pid, endpoint, str(log_dir), broker)
    if cfg.change_stream.active and not cfg.change_stream.registry_url:
        from infra.registry.apicurio import ccompat_url, start_registry

        try:
            registry = start_registry(log_dir, timeout_s=max(cfg.stack.start_timeout_s, 120.0))
        except BaseException:
            stop_stack(state)
            raise
        state.registry_pid, state.registry_url = registry.pid, ccompat_url(registry.address)
    return state


def _start_tansu(log_dir: Path, storage: str, endpoint: str, timeout_s: float) -> tuple[ServerProcess, str]:
    from infra.brokers.tansu import start_broker

    broker_storage = "memory://tansu/"
    if storage == "s3":
        from infra.objectstore import S3Store

        S3Store("tansu", "", ObjectStoreConfig(endpoint_url=endpoint, access_key_id=ACCESS_KEY,
                                                secret_access_key=SECRET_KEY)).ensure_bucket()
        broker_storage = "s3://tansu/"
    process = start_broker(
        log_dir,
        storage=broker_storage,
        s3_endpoint=endpoint,
        s3_access_key=ACCESS_KEY,
        s3_secret_key=SECRET_KEY,
        timeout_s=timeout_s,
    )
    return process, broker_storage


def stop_stack(state: StackState) -> list[str]:
    stopped = []
    for name, pid, marker in (
        ("broker", state.broker_pid, state.broker_marker),
        ("s3", state.s3_pid, "moto"),
        ("schema registry", state.registry_pid, "kwal-schema-registry"),
    ):
        if not pid:
            continue
        if _pid_is_ours(pid, marker):
            stop_pid(pid)
            stopped.append(f"{name} (pid {pid})")
    return stopped


def run_up(args: Any, cfg: KwalConfig) -> int:
    existing = read_state(cfg)
    if existing and _pid_is_ours(existing.broker_pid, existing.broker_marker):
        print(f"kwal: a stack is already up (broker {existing.broker_address}); `kwal down` first")
        return 1
    try:
        secure = bool(getattr(args, "secure", False))
        state = start_stack(
            cfg, getattr(args, "broker_storage", "memory"), getattr(args, "broker", DEFAULT_BROKER), secure
        )
    except ServerStartError as e:
        print(f"kwal up: {e}", file=sys.stderr)
        return 1
    path = state_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(state), indent=2))
    print(f"broker  {state.broker_address}  ({state.broker}, pid {state.broker_pid}, storage {state.broker_storage})")
    print(f"s3      {state.s3_endpoint}  (pid {state.s3_pid})")
    if state.registry_url:
        print(f"registry {state.registry_url}  (pid {state.registry_pid})")
    print(f"logs    {state.log_dir}")
    if secure:
        configs = Path(cfg.stack.state_dir) / "secure"
        print(f"secure  SASL_SSL + SCRAM-SHA-512, kwal's ACLs applied; one config per principal in {configs}")
        print(f"export KWAL_CONFIG={configs}/<principal>.toml   (docs/security.md)")
    else:
        print(f"export KWAL_BOOTSTRAP={state.broker_address}")
    return 0


def run_down(args: Any, cfg: KwalConfig) -> int:
    state = read_state(cfg)
    if state is None:
        print(f"kwal: no stack is up (no state file at {state_path(cfg)})")
        return 0
    stopped = stop_stack(state)
    state_path(cfg).unlink(missing_ok=True)
    print("stopped " + (", ".join(stopped) if stopped else "nothing (processes were already gone)"))
    return 0


def run_status(args: Any, cfg: KwalConfig) -> int:
    state = read_state(cfg)
    if state is None:
        print("no stack is up")
        return 1
    broker_up = _pid_is_ours(state.broker_pid, state.broker_marker) and port_open(state.broker_address)
    s3_up = _pid_is_ours(state.s3_pid, "moto") and port_open(state.s3_endpoint.removeprefix("http://"))
    print(f"broker  {state.broker_address}  {state.broker}  pid {state.broker_pid}  {'up' if broker_up else 'DOWN'}")
    print(f"s3      {state.s3_endpoint}  pid {state.s3_pid}  {'up' if s3_up else 'DOWN'}")
    return 0 if broker_up and s3_up else 1
