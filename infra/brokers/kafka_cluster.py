"""A local Apache Kafka cluster: N combined broker+controller KRaft nodes on loopback.

What a Kafka user runs (three brokers, topics replicated three times, two in sync
for a write), small enough for a laptop or a 2-core test machine:

1. each node (`KafkaNode`, one JVM) gets its own directory, log, client port and
   controller port (free loopback ports) and node id 1..N;
2. every node names all N as `controller.quorum.voters` (a static KRaft quorum)
   and is formatted with the same cluster id;
3. the N nodes are started at once and each start waits, bounded, until the node
   answers a Metadata request: a node cannot finish starting alone, since its
   broker must register with an elected controller, which needs a majority of
   the voters.

Settings (`cluster_settings`): Kafka's internal topics (consumer offsets,
transaction state, share-group state) and the default for new topics are
replicated `replication_factor` times with `min_insync_replicas` in sync; kwal's
own topics get the same from `KwalConfig.topics` (`infra.topics`). A node killed
without a controlled shutdown is noticed when its session with the controller
times out (`broker.session.timeout.ms`, 9 s by Kafka's default); here it is 3 s
(heartbeats every 0.5 s), so that a partition's leadership moves within seconds.
Each JVM gets a smaller heap than the single node and starts cheaper
(`CLUSTER_JVM_OPTIONS`): three of them share the machine.

`kill(node_id)` (SIGKILL) and `restart(node_ids)` serve the fault tests: a
restarted node keeps its ports and data and catches up from the others.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient

from infra.brokers.apache_kafka import KafkaNode, cluster_id

# A small heap each, and the JIT's first tier only: a node's start (and a restart after a
# kill) costs half the CPU seconds (measured on 2 cores: 6 s instead of 13 s for the three
# nodes' start, 4.4 s instead of 7.8 s to restart two), which is what a loaded 2-core
# machine waits on; a small local cluster does not need the second tier's peak speed.
CLUSTER_JVM_OPTIONS = "-Xms128m -Xmx384m -XX:+UseG1GC -XX:TieredStopAtLevel=1"
DEFAULT_SIZE = 3


def cluster_settings(replication_factor: int, min_insync_replicas: int) -> dict[str, str]:
    """Broker settings of every node of a cluster (over `apache_kafka.BROKER_SETTINGS`)."""
    rf, isr = str(replication_factor), str(min_insync_replicas)
    return {
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
        "default.replication.factor": rf,
        "min.insync.replicas": isr,
        # a killed node is fenced (its partitions get new leaders, it leaves their ISR)
        # 3 s after its last heartbeat instead of 9 s
        "broker.heartbeat.interval.ms": "500",
        "broker.session.timeout.ms": "3000",
        # a restarted node's replicas are caught up and back in sync soon
        "replica.fetch.backoff.ms": "200",
        "num.network.threads": "1",
        "num.io.threads": "2",
    }


def replication_for(size: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) kwal uses on a cluster of `size` nodes:
    three replicas where there are three nodes, one fewer in sync (a write survives one
    node down); a single node: one replica."""
    rf = min(3, size)
    return rf, max(1, rf - 1)


@dataclass
class KafkaCluster:
    """N combined KRaft nodes whose data and logs live under `directory/node-<id>`."""

    directory: Path
    size: int = DEFAULT_SIZE
    jvm_options: str = CLUSTER_JVM_OPTIONS
    timeout_s: float = 120.0
    nodes: dict[int, KafkaNode] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"a Kafka cluster needs at least one node, got size={self.size}")
        rf, isr = replication_for(self.size)
        self.replication_factor, self.min_insync_replicas = rf, isr
        settings = cluster_settings(rf, isr)
        cid = cluster_id()
        for node_id in range(1, self.size + 1):
            self.nodes[node_id] = KafkaNode(
                self.directory / f"node-{node_id}",
                extra=settings,
                timeout_s=self.timeout_s,
                node_id=node_id,
                cluster_id=cid,
                jvm_options=self.jvm_options,
            )
        voters = ",".join(node.voter for node in self.nodes.values())
        for node in self.nodes.values():
            node.voters = voters

    @property
    def bootstrap(self) -> str:
        """Every node's client address, comma-separated (`bootstrap.servers`)."""
        return ",".join(node.address for node in self.nodes.values())

    def pids(self) -> list[int]:
        return [n.process.pid for n in self.nodes.values() if n.process is not None]

    def start(self) -> KafkaCluster:
        """Format (first start) and start every node at once; bounded wait for each."""
        try:
            self._start_nodes(self.nodes)
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self, node_ids: Iterable[int]) -> None:
        """Start these (killed or stopped) nodes again, at once: same ports, same data."""
        self._start_nodes(list(node_ids))

    def _start_nodes(self, node_ids: Iterable[int]) -> None:
        ids = list(node_ids)
        with ThreadPoolExecutor(max_workers=max(1, len(ids))) as pool:
            for fut in [pool.submit(self.nodes[i].start) for i in ids]:
                fut.result()  # the first failure raises, naming its node's log

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (no controlled shutdown)."""
        self.nodes[node_id].kill()

    def alive(self) -> list[int]:
        return [i for i, n in self.nodes.items() if n.alive()]

    def stop(self) -> None:
        """SIGTERM every node at once (then SIGKILL after 30 s): one node stopped after
        the others would wait for a controller that is gone."""
        with ThreadPoolExecutor(max_workers=len(self.nodes)) as pool:
            list(pool.map(lambda node: node.stop(), self.nodes.values()))

    # -- what the cluster says about its partitions ------------------------------------------

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 2})

    def leader(self, topic: str, partition: int = 0, timeout_s: float = 10.0) -> int:
        """The node id leading `topic`'s `partition` now (-1: none)."""
        md = self.admin().list_topics(topic, timeout=timeout_s)
        return int(md.topics[topic].partitions[partition].leader)

    def controller(self, timeout_s: float = 10.0) -> int:
        """The node id of the active controller, as a broker reports it (-1: none known)."""
        return int(self.admin().list_topics(timeout=timeout_s).controller_id)

    def under_replicated(self, timeout_s: float = 10.0) -> list[str]:
        """The partitions (`topic/partition`, every topic's) whose ISR lacks one of their
        replicas, or that have no leader; empty when the cluster is fully in sync."""
        md = self.admin().list_topics(timeout=timeout_s)
        out = []
        for name, t in md.topics.items():
            if t.error is not None:
                out.append(f"{name} ({t.error})")
                continue
            for p, pm in t.partitions.items():
                if set(pm.isrs) != set(pm.replicas) or pm.leader < 0:
                    out.append(f"{name}/{p}")
        return out
