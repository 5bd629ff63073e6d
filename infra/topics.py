"""Create and verify kwal's topics, with explicit configs; idempotent.

Every topic kwal produces to is declared here and created by `ensure_topics` before
anything is written to it; kwal's clients also ask the broker never to create a topic
on their behalf (`allow.auto.create.topics=false`, infra.config), so a topic the broker
would make with its own defaults (partitions, cleanup, retention) is an error instead.

| role               | partitions            | cleanup        | retention                     |
|--------------------|-----------------------|----------------|-------------------------------|
| requests           | 1                     | delete         | topics.requests_retention_ms  |
| results            | 1                     | delete         | topics.requests_retention_ms  |
| wal                | topics.wal_partitions | delete         | -1: only truncation (after a  |
|                    |                       |                | checkpoint) removes entries   |
| wal-meta           | 1                     | compact        | latest truncation point/epoch |
| catalog            | 1                     | compact,delete | -1 (+ heartbeats compacted)   |
| logtail.<db>.<tbl> | 1                     | compact,delete | -1 (+ heartbeats compacted)   |
| ops                | 1                     | delete         | 1 day: operator commands to   |
|                    |                       |                | the running TN (kwal ops ...) |
| requests.<service> | 1                     | delete         | as requests; secure mode only |
| results.<service>  | 1                     | delete         | as results; secure mode only  |
| changes.<db>.<tbl> | 1                     | delete         | -1 (the change stream, opt-in:|
| changes.transactions| 1                    | delete         | consumers.cdc)                |

The catalog and logtail topics: every record has a key of its own except heartbeats,
which all share one key (`schemas.logtail.HEARTBEAT_KEY`). Compaction therefore keeps
every change, DDL, block-meta and checkpoint record and only the newest heartbeat of
each topic (a heartbeat is a state, "every change up to ts H is before me", and the
newest one supersedes the others); `delete` with retention -1 deletes nothing by time
or size but lets the TN truncate below a checkpoint (DeleteRecords needs `delete` in
the policy). The log cleaner works on closed segments only: `segment.ms` rolls the
active segment every `topics.logtail_segment_ms`, and `max.compaction.lag.ms` (the
same) makes the cleaner take a rolled segment even when the topic's dirty ratio is
low. System tables (`kwal_system.*`) have no topic: their changes are never pushed.
Retention of the WAL and logtail topics may be set later by an operator, only to a
value `kwal ops retention --check` calls safe. Topics that carry rows (requests, WAL,
catalog, logtail) take records up to `cfg.max_record_bytes` (`max.message.bytes`;
brokers default to ~1 MB).

Replication: every topic kwal creates has `topics.replication_factor` replicas and, when
`topics.min_insync_replicas` is set, that topic-level `min.insync.replicas` (with kwal's
producers at `acks=all`, a write is acknowledged once that many replicas have it). On a
single node both are 1; on a cluster of three, 3 and 2: an acknowledged write is on two
nodes, and one node may be down without stopping writes (`infra.brokers.kafka_cluster`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    OffsetSpec,
    TopicMetadata,
)

from infra.config import KwalConfig


class TopicError(RuntimeError):
    """A topic could not be created, or exists with settings kwal cannot use."""


KEEP_FOREVER = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 1
    config: dict[str, str] = field(default_factory=dict)


def _rows(cfg: KwalConfig, config: dict[str, str]) -> dict[str, str]:
    """`config` for a topic whose records carry rows: large records allowed."""
    return {**config, "max.message.bytes": str(cfg.max_record_bytes)}


def _bounded(ms: int) -> dict[str, str]:
    return {"cleanup.policy": "delete", "retention.ms": str(ms), "retention.bytes": "-1"}


def _logtail_config(cfg: KwalConfig) -> dict[str, str]:
    roll = str(cfg.topics.logtail_segment_ms)
    return {
        "cleanup.policy": "compact,delete",
        "retention.ms": "-1",
        "retention.bytes": "-1",
        "segment.ms": roll,
        "max.compaction.lag.ms": roll,
        "min.compaction.lag.ms": "0",
    }


def wal_topics(cfg: KwalConfig) -> list[TopicSpec]:
    """The WAL and its meta topic (what the Kafka log backend needs)."""
    t = cfg.topics
    return [
        TopicSpec(t.wal, t.wal_partitions, _rows(cfg, KEEP_FOREVER)),
        TopicSpec(t.wal_meta, 1, {"cleanup.policy": "compact"}),
    ]


def core_topics(cfg: KwalConfig) -> list[TopicSpec]:
    t = cfg.topics
    return [
        TopicSpec(t.requests, 1, _rows(cfg, _bounded(t.requests_retention_ms))),
        TopicSpec(t.results, 1, _bounded(t.requests_retention_ms)),
        *wal_topics(cfg),
        TopicSpec(t.catalog, 1, _rows(cfg, _logtail_config(cfg))),
        TopicSpec(t.ops, 1, {"cleanup.policy": "delete", "retention.ms": str(24 * 3600 * 1000)}),
    ]


def principal_topics(cfg: KwalConfig, principal: str) -> list[TopicSpec]:
    """Secure mode: a service's own requests and results topics (docs/security.md), set as
    the TN's requests and results topics are."""
    t = cfg.topics
    return [
        TopicSpec(t.requests_of(principal), 1, _rows(cfg, _bounded(t.requests_retention_ms))),
        TopicSpec(t.results_of(principal), 1, _bounded(t.requests_retention_ms)),
    ]


def logtail_topic(cfg: KwalConfig, database: str, table: str) -> TopicSpec:
    return TopicSpec(cfg.topics.logtail(database, table), 1, _rows(cfg, _logtail_config(cfg)))


def change_stream_topics(cfg: KwalConfig, tables: Iterable[str]) -> list[TopicSpec]:
    """The change stream's topics (consumers.cdc): one per table (`db.table`) and the
    transaction metadata topic. One partition each: a reader applies a table's changes, and
    whole transactions, in commit order. Kept until an operator sets a retention."""
    t = cfg.topics
    specs = [TopicSpec(t.changes_transactions, 1, dict(KEEP_FOREVER))]
    for name in tables:
        database, _, table = name.partition(".")
        specs.append(TopicSpec(t.changes(database, table), 1, _rows(cfg, KEEP_FOREVER)))
    return specs


def replication(cfg: KwalConfig) -> tuple[int, dict[str, str]]:
    """The replication factor of every topic kwal creates and the topic config it adds
    (`min.insync.replicas`, unless left to the broker); TopicError on settings with which
    no write could ever be acknowledged."""
    rf, isr = cfg.topics.replication_factor, cfg.topics.min_insync_replicas
    if rf < 1:
        raise TopicError(f"topics.replication_factor must be at least 1, got {rf}")
    if not 0 <= isr <= rf:
        raise TopicError(
            f"topics.min_insync_replicas={isr} must be between 0 (the broker's default) and "
            f"topics.replication_factor={rf}: with more in-sync replicas required than there "
            "are replicas, no write would ever be acknowledged"
        )
    return rf, ({"min.insync.replicas": str(isr)} if isr else {})


def admin_client(cfg: KwalConfig) -> AdminClient:
    return AdminClient(cfg.kafka_client())


def ensure_topics(
    cfg: KwalConfig, specs: Iterable[TopicSpec] | None = None, timeout_s: float = 15.0
) -> None:
    """Create missing topics; verify existing ones have at least the partitions asked.

    1. list the cluster's topics (bounded wait);
    2. create the missing ones in one request; "already exists" from a racing
       creator counts as success;
    3. wait (bounded) until the broker's metadata lists the created topics with their
       partitions: CreateTopics returns once the controller has them, and a KRaft
       broker's metadata cache can answer without them for a moment after (a driver
       opening right after would see its WAL topic "missing"), each partition with a leader,
       and until each partition's leader answers for it (ListOffsets): the metadata names a
       leader a moment before that broker serves the partition, and a consumer's
       `get_watermark_offsets` in that moment fails with "not leader for partition" (a
       producer retries; a watermark query does not);
    4. check partition counts of those that existed (a WAL topic with fewer
       partitions than configured is an error: CreatePartitions is not
       available everywhere, so kwal never grows a topic silently), and their
       replicas (fewer than `topics.replication_factor` is an error: such a topic
       does not survive the broker failures the setting promises).
    """
    specs = list(core_topics(cfg) if specs is None else specs)
    replicas, replicated = replication(cfg)
    admin = admin_client(cfg)
    try:
        md = admin.list_topics(timeout=timeout_s)
    except KafkaException as e:
        raise TopicError(f"cannot list topics on {cfg.bootstrap}: {e}") from e
    missing = [s for s in specs if s.name not in md.topics]
    if missing:
        futures = admin.create_topics(
            [
                NewTopic(s.name, s.partitions, replicas, config={**s.config, **replicated})
                for s in missing
            ],
            operation_timeout=timeout_s,
            request_timeout=timeout_s,
        )
        for name, future in futures.items():
            try:
                future.result(timeout=timeout_s)
            except KafkaException as e:
                if "TOPIC_ALREADY_EXISTS" not in str(e) and "already exists" not in str(e):
                    raise TopicError(f"cannot create topic {name} on {cfg.bootstrap}: {e}") from e
        deadline = time.monotonic() + timeout_s
        _await_metadata(admin, [s.name for s in missing], timeout_s, cfg.bootstrap)
        _await_serving(admin, missing, deadline, cfg.bootstrap)
    for spec in specs:
        if spec in missing:
            continue
        partitions = md.topics[spec.name].partitions
        if len(partitions) < spec.partitions:
            raise TopicError(
                f"topic {spec.name} has {len(partitions)} partitions, kwal is configured for "
                f"{spec.partitions}"
            )
        # (a broker that lists no replicas, like the embedded one, is taken at its word)
        fewest = min((len(p.replicas) for p in partitions.values() if p.replicas), default=replicas)
        if fewest < replicas:
            raise TopicError(
                f"topic {spec.name} has partitions with {fewest} replicas, kwal is configured "
                f"for topics.replication_factor={replicas}: add replicas (kafka-reassign-"
                "partitions) or lower the setting"
            )


def _await_metadata(admin: AdminClient, names: list[str], timeout_s: float, where: str) -> None:
    """Step 3 of `ensure_topics`."""
    deadline = time.monotonic() + timeout_s
    todo = set(names)
    while todo:
        try:
            md = admin.list_topics(timeout=max(0.5, deadline - time.monotonic()))
        except KafkaException as e:
            raise TopicError(f"cannot list topics on {where}: {e}") from e
        todo = {n for n in todo if not _led(md.topics.get(n))}
        if todo and time.monotonic() > deadline:
            raise TopicError(f"topics {sorted(todo)} were created but not listed by {where} "
                             f"within {timeout_s:.0f}s")
        if todo:
            time.sleep(0.05)


# ListOffsets errors that mean "this partition's leader does not serve it yet", besides
# those Kafka marks retriable (UNKNOWN_LEADER_EPOCH: "leader epoch is newer than broker
# epoch", seen while a new leader applies its metadata). _NOENT is librdkafka's own
# "Failed to query partition leaders: No leaders found": on a multi-broker cluster the
# broker that answered its metadata request had not yet learnt the new topic's leader
# (CI run of stop 44, tests/faults/test_cluster.py, right after create_topics).
_NOT_SERVING_YET = frozenset(
    {
        KafkaError._NOENT,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.REPLICA_NOT_AVAILABLE,
    }
)


def _await_serving(admin: AdminClient, specs: list[TopicSpec], deadline: float, where: str) -> None:
    """Step 3 of `ensure_topics`, its end: ask every partition of the created topics for its
    end offset until each leader answers (bounded by `deadline`)."""
    todo = [TopicPartition(s.name, p) for s in specs for p in range(s.partitions)]
    while todo:
        left = deadline - time.monotonic()
        futures = admin.list_offsets(
            {tp: OffsetSpec.latest() for tp in todo}, request_timeout=max(0.5, left)
        )
        waiting: list[TopicPartition] = []
        for tp, future in futures.items():
            try:
                future.result()
            except KafkaException as e:
                err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
                if err is None or not (err.retriable() or err.code() in _NOT_SERVING_YET):
                    raise TopicError(f"topic {tp.topic} [{tp.partition}] on {where}: {e}") from e
                waiting.append(tp)
        todo = waiting
        if todo and time.monotonic() > deadline:
            names = sorted({tp.topic for tp in todo})
            raise TopicError(f"topics {names} were created but their leaders on {where} did not "
                             "serve them in time")
        if todo:
            time.sleep(0.05)


def _led(topic: TopicMetadata | None) -> bool:
    """A created topic is usable once the metadata lists it without error and every one
    of its partitions has a leader and no error: a partition listed before its leader
    is elected answers a produce with "not leader for partition"."""
    if topic is None or topic.error is not None or not topic.partitions:
        return False
    return all(p.error is None and p.leader >= 0 for p in topic.partitions.values())


def alter_topic_configs(
    admin: AdminClient, topics: list[str], values: Mapping[str, int | str], timeout_s: float = 10.0
) -> None:
    """Set `values` ({"retention.ms": v, ...}) on `topics` (incremental_alter_configs);
    KafkaException when the broker cannot."""
    resources = [
        ConfigResource(
            ConfigResource.Type.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(name, str(value), incremental_operation=AlterConfigOpType.SET)
                for name, value in values.items()
            ],
        )
        for topic in topics
    ]
    futures = admin.incremental_alter_configs(resources, request_timeout=timeout_s)
    for fut in futures.values():
        fut.result(timeout=timeout_s)
