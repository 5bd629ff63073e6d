"""kwal's one configuration object.

Every component takes its settings from a `KwalConfig`. Sources, later wins:

1. the defaults below (the embedded stack on a laptop);
2. a TOML file: `$KWAL_CONFIG`, else `./kwal.toml` if present. Sections are
   the dataclass names below (`[topics]`, `[wal]`, ...), plus `[kafka]`;
3. environment variables `KWAL_<SECTION>_<FIELD>` (e.g. `KWAL_WAL_BACKEND=kafka`,
   `KWAL_TN_HEARTBEAT_MS=20`).

Kafka client settings are passed to confluent-kafka untouched: the `[kafka]`
table holds librdkafka property names as they are (`"security.protocol"`,
`"sasl.mechanism"`, `"ssl.ca.location"`, ...), and an environment variable
`KWAL_KAFKA_SASL_USERNAME` becomes `sasl.username` (lower case, `_` -> `.`).
`KWAL_BOOTSTRAP` is a short form of `bootstrap.servers`.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration value is missing, unknown or of the wrong type."""


@dataclass
class TopicsConfig:
    prefix: str = "kwal"
    wal_partitions: int = 1
    # every kwal topic's replicas, and how many must have a write before it is acknowledged
    # (producers use acks=all); 0 = the broker's min.insync.replicas. A cluster of three:
    # 3 and 2 (`kwal up --brokers 3` sets them for commands that use its stack)
    replication_factor: int = 1
    min_insync_replicas: int = 0
    requests_retention_ms: int = 7 * 24 * 3600 * 1000  # requests and results topics
    # how often the catalog/logtail topics' active segment rolls: the log cleaner
    # compacts their heartbeats away in closed segments only (infra.topics)
    logtail_segment_ms: int = 10 * 60 * 1000

    def name(self, role: str) -> str:
        return f"{self.prefix}.{role}"

    @property
    def tn_transactional_id(self) -> str:
        """The transactional.id bound to the WAL: one per topic prefix, so the TN that opens
        this WAL fences every older one (KIP-98, docs/fencing.md)."""
        return self.name("tn")

    @property
    def requests(self) -> str:
        return self.name("requests")

    @property
    def results(self) -> str:
        return self.name("results")

    @property
    def wal(self) -> str:
        return self.name("wal")

    @property
    def wal_meta(self) -> str:
        return self.name("wal-meta")

    @property
    def catalog(self) -> str:
        return self.name("catalog")

    @property
    def ops(self) -> str:
        """Operator commands to the running TN and its replies (`kwal ops compact`)."""
        return self.name("ops")

    def logtail(self, database: str, table: str) -> str:
        return self.name(f"logtail.{database}.{table}")

    def requests_of(self, principal: str) -> str:
        """Secure mode: the requests topic only `principal` may write (docs/security.md)."""
        return self.name(f"requests.{principal}")

    def results_of(self, principal: str) -> str:
        """Secure mode: the results topic only `principal` may read."""
        return self.name(f"results.{principal}")

    def changes(self, database: str, table: str) -> str:
        """A table's change stream (consumers.cdc, docs/change-stream.md)."""
        return self.name(f"changes.{database}.{table}")

    @property
    def changes_transactions(self) -> str:
        """The change stream's transaction metadata (BEGIN/END per transaction)."""
        return self.name("changes.transactions")


@dataclass
class ObjectStoreConfig:
    url: str = "file://.kwal/objects"  # or s3://bucket/prefix
    endpoint_url: str = ""  # S3 endpoint; empty = AWS default
    region: str = "us-east-1"
    access_key_id: str = ""
    secret_access_key: str = ""


@dataclass
class WalConfig:
    backend: str = "kafka"  # kafka (the Log Service) | file (one machine, no shared log) | memory
    dir: str = ".kwal/wal"
    segment_bytes: int = 64 << 20
    recovery_mode: str = "point-in-time"
    group_max_entries: int = 512
    group_max_bytes: int = 1 << 20
    window: int = 4096  # max LSN distance newest-issued ahead of oldest-unacknowledged
    append_timeout_s: float = 30.0
    # split-brain fencing (docs/fencing.md): transactions (a transactional.id bound to the
    # WAL: the broker fences a replaced TN; needs read_committed that hides aborted
    # records) | epoch (the WAL's own epoch rule only: no split-brain safety) | auto (
    # transactions where `kwal doctor`'s read_committed probe works, else epoch)
    fence: str = "auto"
    # the retention floor (tn/logstore/kafka_backend/retention_floor.py): how often the TN
    # checks the WAL topic's retention against its un-checkpointed entries (0: never), and
    # the headroom it keeps above their age / size (must exceed what one check interval,
    # plus a slow broker answer, adds to them)
    retention_floor_check_s: float = 5.0
    retention_headroom_s: float = 60.0
    retention_headroom_bytes: int = 256 << 20
    # compression.type of the TN's producer (the WAL, and the logtail and results where
    # they ride the WAL's transactional bus): one of WAL_COMPRESSIONS
    # (docs/perf-commit.md, "2026-11-27 (3)")
    compression: str = "none"

    def compression_type(self) -> str:
        """`compression`, checked: ConfigError naming the allowed values otherwise."""
        if self.compression not in WAL_COMPRESSIONS:
            raise ConfigError(
                f"wal.compression must be one of {', '.join(WAL_COMPRESSIONS)}, "
                f"got {self.compression!r}"
            )
        return self.compression


WAL_COMPRESSIONS = ("none", "lz4", "zstd", "snappy", "gzip")


@dataclass
class TnConfig:
    heartbeat_ms: int = 200  # an idle table's watermark lags by at most this (tn.logtail.heartbeat)
    # linger.ms of the logtail publisher's own producer (where the logtail does not ride the
    # WAL's transactional bus): 2 ms cost the engine's process ~1.6x the CPU per commit at
    # 1k commits/s than 10 ms (librdkafka's broker thread), which is commit->visible tail
    # latency on a busy machine (docs/perf-commit.md, "commit->visible")
    logtail_linger_ms: int = 10
    checkpoint_interval_s: float = 60.0
    checkpoint_wal_bytes: int = 256 << 20
    # threads that put a checkpoint's objects (each put waits for the store: a fsync, a
    # PUT's round trip), write the blocks' filters and drop their rows (docs/memory.md)
    checkpoint_put_workers: int = 8
    max_request_bytes: int = 8 << 20
    commit_queue: int = 4096
    metrics_port: int = 0  # 0 = no metrics endpoint
    metrics_interval_s: float = 1.0  # how often the TN samples its gauges
    write_acl: str = ""  # client=db.t1|db.*;other=db2.* (empty: everyone writes everything)
    # A repeated request id gets the first copy's outcome while that copy is among the last
    # `dedup_window` requests (docs/retries.md); across a TN restart too.
    dedup_window: int = 100_000
    # Key filters of flushed blocks (docs/memory.md): bits per key of each block's bloom
    # filter (0: a 1-bit filter, every lookup of a flushed key reads a key column), and
    # how many blocks' key columns / row ts the TN caches.
    pk_filter_bits_per_key: int = 10
    object_cache_blocks: int = 32
    # The requests reader's stall check (infra.reader_stall; tn.service.service, "A stuck
    # requests reader"): after this many seconds without a record while the topic holds
    # records past the TN's position, the partition is assigned again at that position
    requests_stall_s: float = 5.0


@dataclass
class ClientConfig:
    """The producers client's large transactions (docs/large-transactions.md): a
    transaction whose INSERT rows exceed `spill_bytes` (Arrow bytes in memory) sends them
    through the object store, as Parquet objects of at most `object_rows` rows, and only
    their keys over Kafka; one above `max_txn_bytes` is refused before anything is sent.
    And its results reader's stall check (`results_stall_s`), and its producer's check for
    lost brokers (`producer_check_s`)."""

    spill_bytes: int = 4 << 20
    max_txn_bytes: int = 1 << 30
    object_rows: int = 16 * 8192  # rows per object; the TN takes at most 16 blocks' worth
    spill_prefix: str = "uploads"  # object keys: <prefix>/<client id>/<request id>/<n>.parquet
    # The results reader's stall check (infra.reader_stall): after this many seconds without
    # a result while the results topic holds records past the reader's position, it is
    # assigned again at its positions (else every commit would time out)
    results_stall_s: float = 5.0
    # The requests producer's check (producers.client._SharedProducer): after this many
    # seconds with requests undelivered and no delivery report, it asks for metadata; after
    # infra.reader_stall.LOST_AFTER such checks fail in a row it is replaced by a new one
    producer_check_s: float = 5.0


@dataclass
class CnConfig:
    """A Python CN's reads (`consumers.core`, docs/cn-memory.md): the objects it reads
    (block and delta Parquet objects) go through an LRU cache of at most `cache_bytes`
    (Arrow bytes of the decoded data); an object is read and streamed `read_batch_rows`
    rows at a time."""

    cache_bytes: int = 64 << 20
    read_batch_rows: int = 65536
    # The logtail reader's stall check (infra.reader_stall): after this many seconds without
    # a record while a followed topic holds records past the CN's position, its topics are
    # assigned again at its positions
    logtail_stall_s: float = 5.0


@dataclass
class CompactionConfig:
    """The TN's scheduled compaction (tn.checkpoint.policy, docs/compaction.md): a table's
    flushed blocks are merged when `min_small_blocks` of them hold at most `small_rows`
    live rows each, or when one has `tombstone_ratio` of its rows deleted."""

    interval_s: float = 30.0  # how often the TN looks; 0 = never by itself (`kwal ops compact`)
    small_rows: int = 2048  # a block with at most this many live rows is small
    min_small_blocks: int = 4  # merge a table's small blocks once it has this many (>= 2)
    tombstone_ratio: float = 0.5  # rewrite a block once this fraction of its rows is deleted
    max_blocks: int = 64  # blocks merged at most in one compaction (bounds its work)


@dataclass
class SecurityConfig:
    """Secure mode (docs/security.md): a request's principal is the one the broker
    authenticated. A service writes `<prefix>.requests.<principal>` and reads
    `<prefix>.results.<principal>` (Kafka ACLs let only that principal do so); the TN takes
    the principal from the topic. The principal lists are what `kwal ops acl apply`
    grants (comma-separated SCRAM user names)."""

    enabled: bool = False
    tn_principal: str = "kwal-tn"
    services: str = ""  # service principals: write their own requests, read their own results
    cns: str = ""  # CN principals: read logtail/catalog; a CN's name is its principal

    def service_list(self) -> list[str]:
        return [s.strip() for s in self.services.split(",") if s.strip()]

    def cn_list(self) -> list[str]:
        return [s.strip() for s in self.cns.split(",") if s.strip()]


@dataclass
class ChangeStreamConfig:
    """The standard change stream per table (consumers.cdc, docs/change-stream.md): opt-in,
    for every user table (`enabled`) or for the tables listed (`tables`)."""

    enabled: bool = False  # every user table
    tables: str = ""  # or only these: comma-separated db.table names
    # the schema registry's Confluent-compatible API (e.g. http://127.0.0.1:8081/apis/ccompat/v7);
    # empty: `kwal up` starts one on loopback (infra.registry)
    registry_url: str = ""

    def table_list(self) -> list[str]:
        names = [t.strip() for t in self.tables.split(",") if t.strip()]
        for name in names:
            database, dot, table = name.partition(".")
            if not dot or not database or not table:
                raise ConfigError(f"change_stream.tables: {name!r} is not a db.table name")
        return names

    @property
    def active(self) -> bool:
        """Whether any table has a change stream."""
        return self.enabled or bool(self.table_list())

    def wants(self, table: str) -> bool:
        """Whether `table` (db.table) gets a change stream."""
        return self.enabled or table in self.table_list()


@dataclass
class StackConfig:
    """The embedded stack `kwal up` runs."""

    state_dir: str = ".kwal"
    broker_storage: str = "memory://tansu/"  # or s3://bucket/ on the local S3 server
    start_timeout_s: float = 30.0


RECORD_FRAMING_BYTES = 64 << 10


@dataclass
class KwalConfig:
    kafka: dict[str, str] = field(default_factory=lambda: {"bootstrap.servers": "127.0.0.1:9092"})
    topics: TopicsConfig = field(default_factory=TopicsConfig)
    objectstore: ObjectStoreConfig = field(default_factory=ObjectStoreConfig)
    wal: WalConfig = field(default_factory=WalConfig)
    tn: TnConfig = field(default_factory=TnConfig)
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    change_stream: ChangeStreamConfig = field(default_factory=ChangeStreamConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    cn: CnConfig = field(default_factory=CnConfig)
    stack: StackConfig = field(default_factory=StackConfig)
    bootstrap_explicit: bool = False  # set when a file or the environment named bootstrap.servers

    @property
    def bootstrap(self) -> str:
        return self.kafka["bootstrap.servers"]

    @property
    def max_record_bytes(self) -> int:
        """The largest Kafka record kwal writes or accepts: a request of
        `tn.max_request_bytes`, or a WAL group of `wal.group_max_bytes` (a committed
        transaction's logtail record is no larger), plus room for the record's framing.
        Brokers default to ~1 MB; kwal's topics and producers are set to this instead, so
        that a transaction the TN accepts is never refused by the broker."""
        return max(self.tn.max_request_bytes, self.wal.group_max_bytes) + RECORD_FRAMING_BYTES

    def kafka_client(self, **overrides: Any) -> dict[str, Any]:
        """Settings for a confluent-kafka client: the pass-through table plus overrides.

        librdkafka's own log lines (connection refused, retries...) are quieted
        to critical by default: kwal reports failures itself, once, with the
        address. Set `log_level` in `[kafka]` (0-7) to see them again.
        """
        # Never let the broker create a topic on a client's behalf, with its own defaults:
        # every topic kwal uses is created by infra.topics with the settings it needs.
        conf: dict[str, Any] = {
            "log_level": 2,
            "log.connection.close": False,
            "allow.auto.create.topics": False,
        }
        conf.update(self.kafka)
        conf.update(overrides)
        return conf

    def with_bootstrap(self, bootstrap: str) -> KwalConfig:
        kafka = dict(self.kafka)
        kafka["bootstrap.servers"] = bootstrap
        # named in code: a running `kwal up` stack must not redirect it (infra.stack.apply_stack)
        return dataclasses.replace(self, kafka=kafka, bootstrap_explicit=True)

    def to_env(self) -> dict[str, str]:
        """This config as `KWAL_*` environment variables (for child processes):
        `KwalConfig.load(environ=cfg.to_env())` gives the same settings back."""
        env = {"KWAL_KAFKA_" + k.replace(".", "_").upper(): v for k, v in self.kafka.items()}
        env["KWAL_BOOTSTRAP"] = self.bootstrap
        for f in dataclasses.fields(self):
            section = getattr(self, f.name)
            if not dataclasses.is_dataclass(section):
                continue
            for sf in dataclasses.fields(section):
                env[f"KWAL_{f.name.upper()}_{sf.name.upper()}"] = str(getattr(section, sf.name))
        return env

    @classmethod
    def load(
        cls, path: str | os.PathLike[str] | None = None, environ: dict[str, str] | None = None
    ) -> KwalConfig:
        env = dict(os.environ if environ is None else environ)
        cfg = cls()
        toml_path = path or env.get("KWAL_CONFIG") or ("kwal.toml" if Path("kwal.toml").exists() else None)
        if toml_path:
            try:
                data = tomllib.loads(Path(toml_path).read_text())
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise ConfigError(f"cannot read config file {toml_path}: {e}") from e
            cfg._apply_mapping(data, source=str(toml_path))
        cfg._apply_env(env)
        cfg.bootstrap_explicit = cfg.kafka["bootstrap.servers"] != cls().kafka["bootstrap.servers"]
        return cfg

    def _apply_mapping(self, data: dict[str, Any], source: str) -> None:
        for section, values in data.items():
            if section == "kafka":
                if not isinstance(values, dict):
                    raise ConfigError(f"{source}: [kafka] must be a table")
                self.kafka.update({str(k): str(v) for k, v in values.items()})
                continue
            target = self._section(section, source)
            if not isinstance(values, dict):
                raise ConfigError(f"{source}: [{section}] must be a table")
            for key, value in values.items():
                _set_field(target, key, value, f"{source}: {section}.{key}")

    def _apply_env(self, env: dict[str, str]) -> None:
        if "KWAL_BOOTSTRAP" in env:
            self.kafka["bootstrap.servers"] = env["KWAL_BOOTSTRAP"]
        sections = {f.name for f in dataclasses.fields(self) if f.name not in ("kafka", "bootstrap_explicit")}
        for name, value in env.items():
            if not name.startswith("KWAL_") or name in ("KWAL_BOOTSTRAP", "KWAL_CONFIG"):
                continue
            rest = name[len("KWAL_") :].lower()
            if rest.startswith("kafka_"):
                self.kafka[rest[len("kafka_") :].replace("_", ".")] = value
                continue
            # a section's name may hold "_" itself (change_stream): the longest that fits
            section = max((s for s in sections if rest.startswith(s + "_")), key=len, default="")
            key = rest[len(section) + 1 :]
            if section and key:
                _set_field(getattr(self, section), key, value, f"environment {name}")

    def _section(self, section: str, source: str) -> Any:
        names = [f.name for f in dataclasses.fields(self) if f.name not in ("kafka", "bootstrap_explicit")]
        if section not in names:
            raise ConfigError(f"{source}: unknown section [{section}] (known: {', '.join(names)})")
        return getattr(self, section)


def _set_field(target: Any, key: str, value: Any, where: str) -> None:
    fields = {f.name: f for f in dataclasses.fields(target)}
    if key not in fields:
        raise ConfigError(f"{where}: unknown setting (known: {', '.join(fields)})")
    current = getattr(target, key)
    try:
        if isinstance(current, bool):
            coerced: Any = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
        elif isinstance(current, int):
            coerced = int(value)
        elif isinstance(current, float):
            coerced = float(value)
        else:
            coerced = str(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: expected {type(current).__name__}, got {value!r}") from e
    setattr(target, key, coerced)
