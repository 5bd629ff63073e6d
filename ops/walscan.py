"""A READ-ONLY scan of the WAL topic and its meta topic, for operators.

It never claims an epoch, never produces to the WAL and never opens a
`KafkaDriver` (opening one would fence the running writer). What it reports:

- per WAL partition: low watermark, the high watermark the broker reports, the
  end actually found, the LSN ranges its records hold, and how many records of
  each format version (`kwal.version`, FORMAT.md §8) it holds;
- from the meta topic: the logical truncation point, the highest epoch and its
  writer, the recorded bases, and the TN's own status record if it publishes one
  (`STATUS_KEY`: `status_record`, published by `StatusPublisher`);
- the log a new writer would recover (`replay.replay` run on headers only, as
  epoch max + 1): its contiguous end, the dropped tail, zombie entries.

The end of each partition is found as `infra.topic_scan` says.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import KafkaException, Message
from confluent_kafka.admin import AdminClient

from infra.config import KwalConfig
from infra.exceptions import OpsError
from infra.topic_scan import (
    END_METHOD,
    read_to_end,
    topic_partitions,
)
from tn.logstore.kafka_backend.exceptions import KafkaLogError
from tn.logstore.kafka_backend.headers import KIND_EPOCH, HeaderError, decode_headers
from tn.logstore.kafka_backend.meta import MetaState
from tn.logstore.kafka_backend.replay import RecordInfo, StoredRecord, record_info, replay
from tn.service.status_publisher import STATUS_KEY

# -- the scan --------------------------------------------------------------------------


@dataclass
class PartitionScan:
    partition: int
    low: int
    high_reported: int
    end: int
    records: int = 0  # kwal records (entries + markers)
    markers: int = 0
    foreign: int = 0  # records without kwal headers
    versions: dict[int, int] = field(default_factory=dict)  # entries records per format version
    bytes: int = 0
    lsn_ranges: list[list[int]] = field(default_factory=list)  # [[first, last], ...] merged

    @property
    def first_lsn(self) -> int:
        return self.lsn_ranges[0][0] if self.lsn_ranges else 0

    @property
    def last_lsn(self) -> int:
        return max((r[1] for r in self.lsn_ranges), default=0)


@dataclass
class WalScan:
    topic: str
    meta_topic: str
    exists: bool
    partitions: list[PartitionScan] = field(default_factory=list)
    truncated: int = 0
    epoch: int = 0  # highest claimed
    writer: str = ""  # its winner
    bases: dict[int, int] = field(default_factory=dict)
    log_end: int = 0  # the contiguous end a new writer would recover (>= truncated)
    tail_dropped: int = 0
    zombies_ignored: int = 0
    max_acked: int = 0  # highest `kwal.acked` header among valid records
    replay_error: str = ""
    tn_status: dict[str, Any] | None = None
    end_method: str = END_METHOD
    infos: list[RecordInfo] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("infos")
        d["bases"] = {str(k): v for k, v in self.bases.items()}
        for p, ps in zip(d["partitions"], self.partitions, strict=True):
            p["versions"] = {str(k): v for k, v in ps.versions.items()}
            p["first_lsn"] = ps.first_lsn
            p["last_lsn"] = ps.last_lsn
        return d


def read_meta(cfg: KwalConfig, timeout_s: float) -> tuple[MetaState, dict[str, Any] | None]:
    """The meta topic's state (truncation point, epochs, bases) and the TN's last status record;
    an empty state when the meta topic does not exist."""
    state = MetaState()
    status: list[dict[str, Any]] = []

    def on_msg(msg: Message) -> None:
        key = msg.key() or b""
        value = msg.value()
        state.apply(key, value)
        if key == STATUS_KEY and value:
            try:
                status.append(json.loads(value))
            except ValueError:
                pass

    admin = AdminClient(cfg.kafka_client())
    parts = topic_partitions(admin, cfg.topics.wal_meta, timeout_s)
    if parts is None:
        return state, None
    read_to_end(cfg, cfg.topics.wal_meta, [0], on_msg, timeout_s)
    return state, (status[-1] if status else None)


def _merge(ranges: list[list[int]], first: int, last: int) -> None:
    if ranges and ranges[-1][1] + 1 == first:
        ranges[-1][1] = last
    else:
        ranges.append([first, last])


def scan_wal(cfg: KwalConfig, timeout_s: float = 30.0) -> WalScan:
    """The read-only scan (module docstring). `OpsError` on a bounded-wait failure."""
    topic = cfg.topics.wal
    admin = AdminClient(cfg.kafka_client())
    try:
        parts = topic_partitions(admin, topic, timeout_s)
        state, status = read_meta(cfg, timeout_s)
    except KafkaException as e:
        raise OpsError(f"cannot read the WAL meta topic {cfg.topics.wal_meta}: {e}") from e
    scan = WalScan(topic=topic, meta_topic=cfg.topics.wal_meta, exists=parts is not None)
    scan.truncated = state.truncated
    scan.epoch = state.max_epoch
    scan.writer = state.claims.get(state.max_epoch, "")
    scan.bases = dict(state.bases)
    scan.tn_status = status
    scan.log_end = state.truncated
    if parts is None:
        return scan
    stored: list[StoredRecord] = []
    by_part: dict[int, PartitionScan] = {}

    def on_msg(msg: Message) -> None:
        p = int(msg.partition() or 0)
        ps = by_part[p]
        size = len(msg.value() or b"")
        ps.bytes += size
        try:
            header = decode_headers(msg.headers())
        except HeaderError:
            ps.foreign += 1
            return
        ps.records += 1
        if header.kind == KIND_EPOCH:
            ps.markers += 1
        elif header.count > 0:
            _merge(ps.lsn_ranges, header.first, header.last)
            ps.versions[header.version] = ps.versions.get(header.version, 0) + 1
        _, ts = msg.timestamp()
        # headers only: replay needs one (empty) payload per entry, never the bytes
        stored.append(
            StoredRecord(p, int(msg.offset() or 0), header, (b"",) * header.count, int(ts), size)
        )

    for p in parts:
        by_part[p] = PartitionScan(p, 0, 0, 0)
    try:
        ends = read_to_end(cfg, topic, parts, on_msg, timeout_s, start=state.truncated_offsets)
    except KafkaException as e:
        raise OpsError(f"cannot read the WAL topic {topic}: {e}") from e
    for p, pe in ends.items():
        ps = by_part[p]
        ps.low, ps.high_reported, ps.end = pe.low, pe.high_reported, pe.end
    scan.partitions = [by_part[p] for p in parts]
    scan.infos = [record_info(r) for r in stored]
    newest = max([state.max_epoch, *(r.header.epoch for r in stored)], default=0)
    try:
        result = replay(stored, state.truncated, state.bases, newest + 1)
    except KafkaLogError as e:
        scan.replay_error = str(e)
    else:
        scan.log_end = result.last_lsn
        scan.tail_dropped = len(result.tail_dropped)
        scan.zombies_ignored = result.zombies_ignored
        scan.max_acked = result.max_acked
    return scan
