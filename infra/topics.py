"""Create and verify kwal's topics, with explicit configs; idempotent.

| role               | partitions          | cleanup  | why                                      |
|--------------------|---------------------|----------|------------------------------------------|
| requests           | 1                   | delete   | TxnRequest records from producers        |
| results            | 1                   | delete   | TxnResult records, keyed by request id   |
| wal                | topics.wal_partitions | delete | the WAL; retention -1: only truncation   |
|                    |                     |          | (after a checkpoint) may remove entries  |
| wal-meta           | 1                   | compact  | truncation point and writer epoch        |
| catalog            | 1                   | delete   | DDL logtail                              |
| logtail.<db>.<tbl> | 1                   | delete   | one per table, created on CREATE TABLE   |

The WAL and logtail topics are created with retention.ms = retention.bytes = -1:
nothing is deleted by time or size until an operator sets a retention that
`kwal ops retention --check` calls safe.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from infra.config import KwalConfig


class TopicError(RuntimeError):
    """A topic could not be created, or exists with settings kwal cannot use."""


KEEP_FOREVER = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 1
    config: dict[str, str] = field(default_factory=dict)


def core_topics(cfg: KwalConfig) -> list[TopicSpec]:
    t = cfg.topics
    return [
        TopicSpec(t.requests, 1, {"cleanup.policy": "delete"}),
        TopicSpec(t.results, 1, {"cleanup.policy": "delete"}),
        TopicSpec(t.wal, t.wal_partitions, dict(KEEP_FOREVER)),
        TopicSpec(t.wal_meta, 1, {"cleanup.policy": "compact"}),
        TopicSpec(t.catalog, 1, dict(KEEP_FOREVER)),
        TopicSpec(t.ops, 1, {"cleanup.policy": "delete", "retention.ms": str(24 * 3600 * 1000)}),
    ]


def logtail_topic(cfg: KwalConfig, database: str, table: str) -> TopicSpec:
    return TopicSpec(cfg.topics.logtail(database, table), 1, dict(KEEP_FOREVER))


def admin_client(cfg: KwalConfig) -> AdminClient:
    return AdminClient(cfg.kafka_client())


def ensure_topics(
    cfg: KwalConfig, specs: Iterable[TopicSpec] | None = None, timeout_s: float = 15.0
) -> None:
    """Create missing topics; verify existing ones have at least the partitions asked.

    1. list the cluster's topics (bounded wait);
    2. create the missing ones in one request; "already exists" from a racing
       creator counts as success;
    3. check partition counts of those that existed (a WAL topic with fewer
       partitions than configured is an error: CreatePartitions is not
       available everywhere, so kwal never grows a topic silently).
    """
    specs = list(core_topics(cfg) if specs is None else specs)
    admin = admin_client(cfg)
    try:
        md = admin.list_topics(timeout=timeout_s)
    except KafkaException as e:
        raise TopicError(f"cannot list topics on {cfg.bootstrap}: {e}") from e
    missing = [s for s in specs if s.name not in md.topics]
    if missing:
        futures = admin.create_topics(
            [
                NewTopic(s.name, s.partitions, cfg.topics.replication_factor, config=s.config)
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
    for spec in specs:
        if spec in missing:
            continue
        have = len(md.topics[spec.name].partitions)
        if have < spec.partitions:
            raise TopicError(
                f"topic {spec.name} has {have} partitions, kwal is configured for {spec.partitions}"
            )
