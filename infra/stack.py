"""`kwal up` / `kwal down` / `kwal status`: the embedded stack for local use.

`up` starts the loopback S3 server (moto) and a broker (Apache Kafka by
default, `--broker tansu` for the embedded one; `--brokers 3`: a cluster of three
Apache Kafka nodes, `infra.brokers.kafka_cluster`; `--secure`: SASL/SCRAM over TLS and
kwal's ACLs, `infra.secure_stack`) in the background, and the schema registry
(infra.registry) when the change stream is enabled (`change_stream.enabled` or `.tables`)
and no `change_stream.registry_url` is set, and writes `<state_dir>/stack.json` with their
PIDs and addresses;
`down` stops exactly the PIDs that file names (after checking each is still
the process `up` started, by its command line) and removes the file. While a
stack is up, commands that were given no Kafka address or object store use the
stack's (see `apply_stack`), and on a cluster the replication the stack was
started for (replication factor 3, `min.insync.replicas` 2) unless their config
sets it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infra.brokers.local import DEFAULT_BROKER, check_broker
from infra.config import KwalConfig, ObjectStoreConfig, TopicsConfig
from infra.processes import ServerStartError, pid_alive, port_open, stop_pid
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
    # a cluster: every node's PID (broker_pid is the first) and the replication its topics get
    broker_pids: list[int] = field(default_factory=list)
    replication_factor: int = 1
    min_insync_replicas: int = 0

    @property
    def pids(self) -> list[int]:
        return self.broker_pids or [self.broker_pid]

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
    default = TopicsConfig()
    if (cfg.topics.replication_factor, cfg.topics.min_insync_replicas) == (
        default.replication_factor,
        default.min_insync_replicas,
    ):
        cfg.topics = dataclasses.replace(
            cfg.topics,
            replication_factor=state.replication_factor,
            min_insync_replicas=state.min_insync_replicas,
        )
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


class StackError(ValueError):
    """`kwal up` was asked for a stack it cannot start."""


@dataclass
class _Brokers:
    """What a broker start left running."""

    pids: list[int]
    address: str
    storage: str
    replication_factor: int = 1
    min_insync_replicas: int = 0


def start_stack(
    cfg: KwalConfig, storage: str = "memory", broker: str = DEFAULT_BROKER, brokers: int = 1,
    secure: bool = False,
) -> StackState:
    """Start the S3 server and the broker (the S3 server first: tansu's `s3` storage
    needs it). Apache Kafka keeps its data in `<state_dir>/kafka`, fresh each `up`;
    `storage` chooses tansu's (memory, or a bucket on the S3 server). `brokers` > 1: a
    cluster of that many Apache Kafka nodes. `secure`: Apache Kafka with SASL/SCRAM over
    TLS and kwal's ACLs (infra.secure_stack)."""
    check_broker(broker)
    if brokers < 1:
        raise StackError(f"--brokers must be at least 1, got {brokers}")
    if brokers > 1 and broker != "kafka":
        raise StackError(f"--brokers {brokers} needs Apache Kafka (--broker kafka): {broker} runs one node")
    if secure and broker != "kafka":
        raise StackError("--secure needs Apache Kafka (tansu has no SASL and no ACLs)")
    if secure and brokers > 1:
        raise StackError("--secure starts one Apache Kafka node; --brokers 3 is not secured yet")
    state_dir = Path(cfg.stack.state_dir)
    log_dir = state_dir / "logs"
    s3 = start_s3_server(log_dir, timeout_s=cfg.stack.start_timeout_s)
    endpoint = f"http://{s3.address}"
    try:
        if broker == "kafka":
            started = _start_kafka(
                cfg, state_dir / "kafka", brokers, secure, max(cfg.stack.start_timeout_s, 120.0)
            )
        else:
            started = _start_tansu(log_dir, storage, endpoint, cfg.stack.start_timeout_s)
    except BaseException:
        s3.stop()
        raise
    state = StackState(
        started.pids[0],
        started.address,
        started.storage,
        s3.pid,
        endpoint,
        str(log_dir),
        broker,
        broker_pids=started.pids if len(started.pids) > 1 else [],
        replication_factor=started.replication_factor,
        min_insync_replicas=started.min_insync_replicas,
    )
    if cfg.change_stream.active and not cfg.change_stream.registry_url:
        from infra.registry.apicurio import ccompat_url, start_registry

        try:
            registry = start_registry(log_dir, timeout_s=max(cfg.stack.start_timeout_s, 120.0))
        except BaseException:
            stop_stack(state)
            raise
        state.registry_pid, state.registry_url = registry.pid, ccompat_url(registry.address)
    return state


def _start_kafka(cfg: KwalConfig, kafka_dir: Path, size: int, secure: bool, timeout_s: float) -> _Brokers:
    """One node (secured or not), or a cluster of `size`, in `kafka_dir` (emptied first)."""
    shutil.rmtree(kafka_dir, ignore_errors=True)
    if secure:
        from infra.secure_stack import start_secure

        process, _ = start_secure(cfg, kafka_dir, timeout_s)
        return _Brokers([process.pid], process.address, str(kafka_dir / "data"))
    if size == 1:
        from infra.brokers.apache_kafka import start_kafka

        process = start_kafka(kafka_dir, timeout_s=timeout_s)
        return _Brokers([process.pid], process.address, str(kafka_dir / "data"))
    from infra.brokers.kafka_cluster import KafkaCluster

    cluster = KafkaCluster(kafka_dir, size=size, timeout_s=timeout_s).start()
    return _Brokers(
        cluster.pids(),
        cluster.bootstrap,
        str(kafka_dir),
        cluster.replication_factor,
        cluster.min_insync_replicas,
    )


def _start_tansu(log_dir: Path, storage: str, endpoint: str, timeout_s: float) -> _Brokers:
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
    return _Brokers([process.pid], process.address, broker_storage)


def stop_stack(state: StackState) -> list[str]:
    """Stop what the state names, after checking each PID is still ours. A cluster's
    nodes are signalled at once (one stopped after the others would wait, in its
    controlled shutdown, for a controller quorum that is gone)."""
    targets = [("broker", pid, state.broker_marker) for pid in state.pids]
    targets.append(("s3", state.s3_pid, "moto"))
    if state.registry_pid:
        targets.append(("schema registry", state.registry_pid, "kwal-schema-registry"))
    ours = [(name, pid) for name, pid, marker in targets if _pid_is_ours(pid, marker)]
    with ThreadPoolExecutor(max_workers=max(1, len(ours))) as pool:
        list(pool.map(lambda target: stop_pid(target[1]), ours))
    return [f"{name} (pid {pid})" for name, pid in ours]


def run_up(args: Any, cfg: KwalConfig) -> int:
    existing = read_state(cfg)
    if existing and _pid_is_ours(existing.broker_pid, existing.broker_marker):
        print(f"kwal: a stack is already up (broker {existing.broker_address}); `kwal down` first")
        return 1
    try:
        state = start_stack(
            cfg,
            getattr(args, "broker_storage", "memory"),
            getattr(args, "broker", DEFAULT_BROKER),
            getattr(args, "brokers", 1),
            bool(getattr(args, "secure", False)),
        )
    except (ServerStartError, StackError) as e:
        print(f"kwal up: {e}", file=sys.stderr)
        return 1
    path = state_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(state), indent=2))
    pids = ", ".join(map(str, state.pids))
    print(f"broker  {state.broker_address}  ({state.broker}, pid {pids}, storage {state.broker_storage})")
    if len(state.pids) > 1:
        print(f"topics  replication factor {state.replication_factor}, "
              f"min.insync.replicas {state.min_insync_replicas} (producers acks=all)")
    print(f"s3      {state.s3_endpoint}  (pid {state.s3_pid})")
    if state.registry_url:
        print(f"registry {state.registry_url}  (pid {state.registry_pid})")
    print(f"logs    {state.log_dir}")
    if getattr(args, "secure", False):
        configs = Path(cfg.stack.state_dir) / "secure"
        print(f"secure  SASL_SSL + SCRAM-SHA-512, kwal's ACLs applied; one config per principal in {configs}")
        print(f"export KWAL_CONFIG={configs}/<principal>.toml   (docs/security.md)")
    else:
        exports = f"KWAL_BOOTSTRAP={state.broker_address}"
        if len(state.pids) > 1:  # a config naming the address itself does not take the stack's replication
            exports += (f" KWAL_TOPICS_REPLICATION_FACTOR={state.replication_factor}"
                        f" KWAL_TOPICS_MIN_INSYNC_REPLICAS={state.min_insync_replicas}")
        print(f"export {exports}")
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
    brokers_up = True
    for pid, address in zip(state.pids, state.broker_address.split(","), strict=False):
        up = _pid_is_ours(pid, state.broker_marker) and port_open(address)
        brokers_up = brokers_up and up
        print(f"broker  {address}  {state.broker}  pid {pid}  {'up' if up else 'DOWN'}")
    s3_up = _pid_is_ours(state.s3_pid, "moto") and port_open(state.s3_endpoint.removeprefix("http://"))
    print(f"s3      {state.s3_endpoint}  pid {state.s3_pid}  {'up' if s3_up else 'DOWN'}")
    return 0 if brokers_up and s3_up else 1
