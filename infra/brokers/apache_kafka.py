"""Apache Kafka as a local KRaft node: the production broker, installed by the project.

Install: the jars of `infra/brokers/kafka/pom.xml` (`kafka_2.13` plus a log4j2
backend) are resolved from Maven Central into `~/.cache/kwal/kafka-<version>/`
once (`infra.maven`). Where `$KAFKA_HOME` names an Apache Kafka distribution,
its `libs/` is used instead and Maven is not needed.

Start (`KafkaNode.start`):
1. write `server.properties` for one combined node (`process.roles=broker,controller`,
   static voter `1@127.0.0.1:<controller port>`, replication factors 1) and a
   log4j2 file that keeps the broker's log at WARN, both in the node's directory;
2. format the KRaft storage directory with `kafka.tools.StorageTool` (once: a
   restart reuses it, and a reused directory keeps its cluster id);
3. start `kafka.Kafka` in its own process group and wait, bounded, until a
   Metadata request names a broker (with WARN logging the "started" line is gone).

The settings favour a 2-core machine and tests that watch retention happen:
a small heap and cleaner buffer, retention checked every second from the start.
Deleted segments leave the log at once but their files only after Kafka's own delay
(`log.segment.delete.delay.ms`, 60 s; see BROKER_SETTINGS). Segments keep Kafka's default size (1 GiB): a
segment must hold kwal's largest record (`KwalConfig.max_record_bytes`, above
8 MiB), so a test that wants segments to roll sets the topic's `segment.ms`.

A cluster of such nodes (node ids, one voter set, one cluster id) is
`infra.brokers.kafka_cluster`.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from infra.brokers import metadata_ok
from infra.maven import MavenError, resolve_jars
from infra.processes import ServerProcess, ServerStartError, free_port, start_server

KAFKA_VERSION = "4.1.1"
POM = Path(__file__).with_name("kafka") / "pom.xml"
HEAP = "-Xms256m -Xmx768m"
JVM_OPTIONS = f"{HEAP} -XX:+UseG1GC"
# Replaces JVM_OPTIONS for every node that is not given its own (`KafkaNode.jvm_options`):
# the test suite sets it (tests/conftest.py) for brokers that live seconds to minutes.
JVM_OPTIONS_ENV = "KWAL_BROKER_JVM_OPTIONS"


def default_jvm_options() -> str:
    """JVM_OPTIONS, or `$KWAL_BROKER_JVM_OPTIONS` where set (read when a node is made)."""
    return os.environ.get(JVM_OPTIONS_ENV) or JVM_OPTIONS


# Broker settings of every local node; `KafkaNode.extra` adds to or overrides them.
BROKER_SETTINGS: dict[str, str] = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "group.initial.rebalance.delay.ms": "0",
    "num.partitions": "1",
    "auto.create.topics.enable": "true",
    "delete.topic.enable": "true",
    # retention that tests can watch: checked every second from start-up
    "log.retention.check.interval.ms": "1000",
    "log.initial.task.delay.ms": "0",
    # log.segment.delete.delay.ms (the topics' file.delete.delay.ms) keeps Kafka's 60 s.
    # A roll schedules a flush of the segments before the new one; a segment that
    # retention deletes before that flush runs must still be open, and Kafka's only guard
    # is this delay (KAFKA-6624, KAFKA-17727). With 0, a topic rolling every few ms under
    # a short retention made the flush meet a closed file (ClosedChannelException), the
    # log dir went offline and the broker shut down mid-suite. The deleted segment leaves
    # the log (log-start offset, `*.log` files) at once either way; only its renamed
    # `.deleted` file waits.
    # Deleting a topic while the retention task still deletes its segments can also take
    # the log dir offline (KAFKA-19571), so `kwal doctor`'s retention
    # probe does not delete its scratch topic (infra.capabilities)
    # a small machine: the cleaner's dedupe buffer is heap (128 MiB by default)
    "log.cleaner.dedupe.buffer.size": str(8 << 20),
    "log.cleaner.threads": "1",
    # the cleaner looks for work every 0.5 s instead of 15 s: compacted heartbeats
    # (infra.topics) go soon after their segment rolls; cheap on a small broker
    "log.cleaner.backoff.ms": "500",
    "num.network.threads": "2",
    "num.io.threads": "4",
    "num.recovery.threads.per.data.dir": "1",
}

LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = OUT
"""


class KafkaUnavailableError(ServerStartError):
    """Apache Kafka cannot be run here; the message says what is missing and the ways out."""


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise KafkaUnavailableError(
            "Apache Kafka needs Java 17+ and none was found (no `java` on PATH, no JAVA_HOME): "
            "install a JDK (apt install openjdk-17-jre-headless), or use the embedded broker "
            "with `--broker tansu` (KWAL_TEST_BROKER=tansu for the tests)"
        )
    return java


def kafka_classpath() -> str:
    """The broker's classpath: `$KAFKA_HOME/libs/*`, else the Maven-resolved cache."""
    home = os.environ.get("KAFKA_HOME")
    if home:
        libs = Path(home) / "libs"
        if not any(libs.glob("kafka_2.13-*.jar")):
            raise KafkaUnavailableError(f"KAFKA_HOME={home} is not an Apache Kafka distribution (no libs/kafka_2.13-*.jar)")
        return f"{libs}/*"
    try:
        jars = resolve_jars(POM, f"kafka-{KAFKA_VERSION}")
    except MavenError as e:
        raise KafkaUnavailableError(
            f"{e}\nOther ways out: set KAFKA_HOME to an Apache Kafka distribution, or use the "
            "embedded broker with `--broker tansu` (KWAL_TEST_BROKER=tansu for the tests)"
        ) from e
    return f"{jars}/*"


@dataclass
class KafkaNode:
    """One combined broker+controller node whose data lives in `directory`.

    `start` after `stop` (or a kill) brings the same node back on the same ports with
    its data (the fault tests' broker restart). Alone by default; a member of a
    cluster (`infra.brokers.kafka_cluster`) is given its `node_id`, the cluster's
    `voters` (`controller.quorum.voters`) and `cluster_id`, and the cluster's settings
    in `extra`."""

    directory: Path
    port: int = 0
    controller_port: int = 0
    extra: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 120.0
    process: ServerProcess | None = None
    node_id: int = 1
    voters: str = ""  # default: this node alone, "<node_id>@127.0.0.1:<controller_port>"
    cluster_id: str = ""  # default: a fresh one at the first format
    jvm_options: str = field(default_factory=default_jvm_options)  # heap, collector, JIT

    def __post_init__(self) -> None:
        self.port = self.port or free_port()
        self.controller_port = self.controller_port or free_port()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def voter(self) -> str:
        """This node as a `controller.quorum.voters` entry."""
        return f"{self.node_id}@127.0.0.1:{self.controller_port}"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    def properties(self) -> dict[str, str]:
        return {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters or self.voter,
            "listeners": f"PLAINTEXT://{self.address},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.address}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir),
            **BROKER_SETTINGS,
            **self.extra,
        }

    def start(self) -> ServerProcess:
        """Install (first use), format (first start) and start the node; bounded wait.

        A variant of the node (`infra.brokers.secure`) changes only the hooks below:
        `prepare` (files the properties name), `format_options`, `description`, `ready`."""
        self.prepare()
        java, classpath = java_binary(), kafka_classpath()
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        log4j = self.directory / "log4j2.properties"
        log4j.write_text(LOG4J2)
        jvm = [java, *self.jvm_options.split(), "-Djava.awt.headless=true",
               f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
        if not (self.data_dir / "meta.properties").exists():
            fmt = subprocess.run(
                [*jvm, "kafka.tools.StorageTool", "format", "-t", self.cluster_id or cluster_id(),
                 "-c", str(config), *self.format_options()],
                capture_output=True, text=True, timeout=self.timeout_s, check=False,
            )
            if fmt.returncode != 0:
                raise ServerStartError(
                    f"formatting Kafka storage {self.data_dir} failed (exit {fmt.returncode}):\n"
                    + "\n".join((fmt.stdout + fmt.stderr).splitlines()[-20:])
                )
        self.process = start_server(
            self.description(),
            [*jvm, "kafka.Kafka", str(config)],
            self.address,
            self.directory / "broker.log",
            ready=self.ready,
            timeout_s=self.timeout_s,
        )
        return self.process

    def prepare(self) -> None:
        """Before the properties are written: nothing for a plaintext node."""

    def format_options(self) -> list[str]:
        """Extra `kafka-storage format` options (the first start only)."""
        return []

    def description(self) -> str:
        return f"kafka broker (Apache Kafka {KAFKA_VERSION})"

    def ready(self) -> bool:
        """Is the node serving? Polled until true or `timeout_s`."""
        return metadata_ok(self.address)

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout_s=30)

    def kill(self) -> None:
        """SIGKILL at once, no controlled shutdown (fault tests): the cluster learns of
        it only when the node's session with the controller times out."""
        if self.process is not None:
            self.process.kill()


def cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (22 chars).

    Never one starting with "-": StorageTool's argument parser would take it for an
    option and refuse the format (one start in 64 failed so); Kafka's own
    `Uuid.randomUuid` draws again for the same reason."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def start_kafka(directory: Path, port: int | None = None, timeout_s: float = 120.0) -> ServerProcess:
    """Start a fresh Apache Kafka node with its data and log under `directory`."""
    return KafkaNode(directory, port=port or 0, timeout_s=timeout_s).start()
