"""Faults on a real 3-node Apache Kafka cluster (KRaft, every node broker and controller):
kwal's topics replicated 3 times, `min.insync.replicas` 2, every producer `acks=all`.
One scenario under load (a TN process, clients committing, a CN following):

1. the leader of the WAL partition is killed (SIGKILL): the TN pauses while leadership
   moves, then goes on committing; the node is restarted and catches up;
2. later another node is killed: the same;
3. a second node is killed too (two of three down: no write can reach two replicas):
   the TN acknowledges nothing, and each client's commit comes back at its timeout
   with the client's TimeoutError (outcome unknown, the request id to ask again);
4. the two nodes return: commits are acknowledged again.

After: kwal's topics have 3 replicas and min.insync.replicas 2; every acknowledged commit is in the TN's state (as its logtail published it), in a
TN rebuilt from the WAL and in a CN started afterwards, at its acknowledged ts; no row
twice, no aborted commit visible, no request with two outcomes on the results topic.

Printed (run with -s): each failover pause (the kill to the first acknowledgement of a
commit sent after it) and the time from the nodes' restart to the next acknowledgement.
The cluster is started once for the module.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import ConfigResource, ConfigSource

from consumers.core.cn import CN
from infra.brokers.kafka_cluster import KafkaCluster
from infra.config import KwalConfig
from infra.objectstore import open_store
from infra.topic_scan import read_to_end
from infra.topics import ensure_topics
from producers import Client
from producers import TimeoutError as ClientTimeout
from schemas.requests import decode_results
from tests.conftest import server_dir, unique
from tests.faults.commit_load import Commit, CommitLoad
from tests.service.harness import recover_engine
from tests.waiting import wait_until
from tn.service.process import TnProcess

TABLE = "f.t"
WORKERS = 4  # committing clients (threads, one commit in flight each)
LOAD_PAUSE_S = 0.01  # between one worker's commits: leave the cores to three JVMs
FAILOVER_COMMIT_TIMEOUT_S = 30.0  # far above a failover: every commit is answered
OUTAGE_COMMIT_TIMEOUT_S = 2.0  # the clients' timeout once two nodes are to be down


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(server_dir("cluster-")).start()
    try:
        yield cluster
    finally:
        for node_id in cluster.alive():  # throwaway data: no controlled shutdown
            cluster.kill(node_id)




def _config(cluster: KafkaCluster, tmp_path: Path) -> KwalConfig:
    cfg = KwalConfig.load(environ={}).with_bootstrap(cluster.bootstrap)
    cfg.topics.prefix = unique("kwal-")
    cfg.topics.replication_factor = cluster.replication_factor
    cfg.topics.min_insync_replicas = cluster.min_insync_replicas
    cfg.wal.backend = "kafka"
    # above any outage here: the TN's WAL appends wait for the nodes' return rather than
    # fail and make the TN reopen its log (tests/faults/test_broker_restart.py has that)
    cfg.wal.append_timeout_s = 120.0
    # no checkpoint while the test runs (its time varies with the machine's load): the
    # rebuilt TN is the WAL's replay, each CN reads its topics from their start
    cfg.tn.checkpoint_interval_s = 3600.0
    cfg.wal.dir = str(tmp_path / "wal")
    cfg.objectstore.url = f"file://{tmp_path / 'objects'}"
    return cfg


def _wait_more_acks(load: CommitLoad, n: int, what: str) -> None:
    have = len(load.acked())
    wait_until(f"{n} more acknowledged commits {what}", lambda: len(load.acked()) >= have + n, 90)


def _ids(table: object) -> list[int]:
    return sorted(table.column("id").to_pylist())  # type: ignore[attr-defined]


def _check_after(cfg: KwalConfig, tn: TnProcess, live_cn: CN, commits: list[Commit]) -> None:
    """After the load: every acknowledged commit is in the TN's state (as its logtail
    published it live), in a TN rebuilt from the WAL and in a CN started now, at its
    acknowledged ts; no row twice; no aborted commit visible; no request with two
    outcomes on the results topic; each CN equals the rebuilt TN at its watermark."""
    acked = {c.key: c for c in commits if c.acked}
    aborted = {c.key for c in commits if c.error is not None and not c.unknown}
    top = max(c.ts for c in acked.values())
    assert live_cn.wait_for(top, TABLE, timeout_s=60), live_cn.errors
    live = _ids(live_cn.snapshot(TABLE, top))
    assert not set(acked) - set(live), sorted(set(acked) - set(live))[:10]

    outcomes: dict[str, set[tuple[str, int]]] = {}

    def on_result(msg: object) -> None:
        for res in decode_results(msg.value()):  # type: ignore[attr-defined]
            outcomes.setdefault(res.request_id, set()).add((res.status.value, res.commit_ts))

    read_to_end(cfg, cfg.topics.results, [0], on_result, timeout_s=60)
    twice = {rid: o for rid, o in outcomes.items() if len(o) > 1}
    assert not twice, list(twice.items())[:5]
    for c in acked.values():
        assert outcomes.get(c.request_id) == {("COMMITTED", c.ts)}, (c, outcomes.get(c.request_id))

    assert tn.terminate() == 0
    engine, log = recover_engine(cfg)
    late = CN(cfg, [TABLE], open_store(cfg.objectstore), name="late").start()
    try:
        rebuilt = _ids(engine.read("f", "t"))
        assert len(rebuilt) == len(set(rebuilt)), "a row is in the rebuilt TN twice"
        assert not set(acked) - set(rebuilt), sorted(set(acked) - set(rebuilt))[:10]
        assert not aborted & set(rebuilt), sorted(aborted & set(rebuilt))[:10]
        # each acknowledged ts is the durable one: the row appears exactly at it
        for c in random.Random(26).sample(sorted(acked.values(), key=lambda c: c.key), 20):
            assert c.key in _ids(engine.read("f", "t", c.ts)), c
            assert c.key not in _ids(engine.read("f", "t", c.ts - 1)), c
        assert late.catch_up(60), late.errors
        for cn in (live_cn, late):
            assert cn.wait_for(top, TABLE, timeout_s=60), (cn.name, cn.errors)
            assert not cn.errors, (cn.name, cn.errors)
            mark = cn.watermark(TABLE)
            assert _ids(cn.snapshot(TABLE, mark)) == _ids(engine.read("f", "t", mark)), (
                f"CN {cn.name} differs from the rebuilt TN at its watermark {mark}"
            )
    finally:
        late.close()
        engine.close()
        log.close()


def _check_replication(cluster: KafkaCluster, cfg: KwalConfig) -> None:
    """Every topic of this run, the TN's logtail topic too, has 3 replicas and its own
    min.insync.replicas=2."""
    admin = cluster.admin()
    ours = {n: t for n, t in admin.list_topics(timeout=20).topics.items() if n.startswith(cfg.topics.prefix + ".")}
    assert cfg.topics.wal in ours and cfg.topics.logtail("f", "t") in ours, sorted(ours)
    for name, t in ours.items():
        assert all(len(p.replicas) == 3 for p in t.partitions.values()), name
    futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, n) for n in ours])
    for res, fut in futures.items():
        entry = fut.result(timeout=20)["min.insync.replicas"]
        assert (entry.value, entry.source) == ("2", ConfigSource.DYNAMIC_TOPIC_CONFIG.value), res.name


def _start(cfg: KwalConfig, tmp_path: Path) -> tuple[TnProcess, Client, CN]:
    ensure_topics(cfg)
    tn = TnProcess(cfg, tmp_path)
    tn.start(timeout_s=120)
    client = Client(cfg, "cluster")
    t = client.begin()
    t.create_database("f")
    t.create_table(TABLE, [("id", "int64")], "id")
    t.commit(timeout=60)
    # with the object store: the TN flushes full blocks there (8192 rows) and the logtail
    # then names the block instead of its rows
    return tn, client, CN(cfg, [TABLE], open_store(cfg.objectstore), name="live").start()


def _kill_and_resume(cluster: KafkaCluster, load: CommitLoad, node: int, wal: str) -> float:
    """Kill `node`, wait for the first acknowledgement of a commit sent after the kill,
    then 30 more; print and return the pause (kill to that first acknowledgement, s)."""
    role = "the WAL's leader" if cluster.leader(wal) == node else "not the WAL's leader"
    if cluster.controller() == node:
        role += ", the active controller"
    killed_at = time.monotonic()
    cluster.kill(node)
    wait_until(
        f"a commit sent after node {node} was killed is acknowledged",
        lambda: load.first_ack_sent_after(killed_at) is not None,
        90,
    )
    first = load.first_ack_sent_after(killed_at)
    assert first is not None
    _wait_more_acks(load, 30, f"after node {node} was killed")
    assert cluster.leader(wal) not in (node, -1), f"{wal} is still led by the killed node {node}"
    print(f"failover pause, node {node} ({role}) killed: {first.done - killed_at:.2f}s")
    return first.done - killed_at


def test_failovers_and_a_lost_write_quorum_under_load(cluster: KafkaCluster, tmp_path: Path) -> None:
    wait_until("every partition of the cluster in sync", lambda: not cluster.under_replicated(), 90)
    cfg = _config(cluster, tmp_path)
    wal = cfg.topics.wal
    tn, client, cn = _start(cfg, tmp_path)
    try:
        load = CommitLoad(
            client, TABLE, workers=WORKERS, timeout_s=FAILOVER_COMMIT_TIMEOUT_S, pause_s=LOAD_PAUSE_S
        ).start()
        try:
            _wait_more_acks(load, 30, "before any kill")

            # 1. kill -9 the WAL partition's leader; bring it back, in sync
            first = cluster.leader(wal)
            print()
            _kill_and_resume(cluster, load, first, wal)
            cluster.restart([first])
            wait_until(f"node {first} back in every ISR", lambda: not cluster.under_replicated(), 90)

            # 2. later another node: the WAL's leader again unless that is the same node
            leader = cluster.leader(wal)
            second = leader if leader != first else min(n for n in cluster.nodes if n != first)
            _kill_and_resume(cluster, load, second, wal)
            commits = load.commits()
            assert not [c for c in commits if not c.acked], [c.error for c in commits if not c.acked][:5]

            # 3. a second node down: no write can reach two replicas. The clients' commits
            # come back with their TimeoutError at their (now short) timeout.
            load.timeout_s = OUTAGE_COMMIT_TIMEOUT_S
            switched = time.monotonic()
            wait_until(
                "every worker committed with the short timeout",
                lambda: {c.worker for c in load.commits() if c.sent > switched} == set(range(WORKERS)),
                60,
            )
            third = cluster.leader(wal)
            down = [second, third]
            cluster.kill(third)
            down_at = time.monotonic()

            def sent_while_down() -> list[Commit]:
                return [c for c in load.commits() if c.sent > down_at]

            wait_until(
                "each worker's commit sent with two nodes down is answered",
                lambda: {c.worker for c in sent_while_down()} == set(range(WORKERS)),
                60,
            )
            while_down = sent_while_down()
            assert not [c for c in while_down if c.acked], "acknowledged with one node of three up"
            for c in while_down:
                assert isinstance(c.error, ClientTimeout), c.error
                assert c.error.code == "timeout" and c.error.request_id == c.request_id
                assert "outcome unknown" in str(c.error) and c.request_id in str(c.error)
            print(f"nodes {down} down: {len(while_down)} commits answered {while_down[0].error}")

            # 4. the nodes return: commits are acknowledged again
            back_at = time.monotonic()
            cluster.restart(down)
            restarted = time.monotonic() - back_at
            wait_until(
                "a commit sent after the nodes returned is acknowledged",
                lambda: load.first_ack_sent_after(back_at) is not None,
                90,
            )
            resumed = load.first_ack_sent_after(back_at)
            assert resumed is not None
            print(f"nodes {down} restarted in {restarted:.2f}s; first acknowledgement "
                  f"{resumed.done - back_at:.2f}s after the restart began")
            _wait_more_acks(load, 30, "after the nodes returned")
        finally:
            load.stop()
        commits = load.commits()
        print(f"{sum(c.acked for c in commits)} acknowledged, {sum(c.unknown for c in commits)} "
              f"unknown, {sum(c.error is not None and not c.unknown for c in commits)} aborted")
        _check_after(cfg, tn, cn, commits)
        _check_replication(cluster, cfg)
    finally:
        cn.close()
        client.close()
        tn.kill()
