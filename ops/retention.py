"""`kwal ops retention --check | --set`: Kafka retention on the WAL and logtail topics.

Retention may never delete a record that is still needed:

- WAL topic: every record holding an LSN above the durable truncation point
  (replay starts there; a hole makes the driver refuse to start). `kwal ops
  truncate` moves that point up to the last checkpoint's LSN.
- logtail topics: every record a CN may still have to read: from the offset
  the last checkpoint recorded for the topic (a new CN bootstraps from the
  checkpoint and follows the topic from there; everything when there is no
  checkpoint or the manifest does not name the topic), and from every CN
  consumer group's committed position (a lagging CN).

For each topic, 1. read retention.ms / retention.bytes (describe_configs);
2. find the needed records' age and bytes (`kafka_backend.retention.safe_retention`,
with its margin) and the floor the TN's schedule needs (`schedule_floor`: what
is needed now is not enough, since the records needed in one checkpoint
interval are not written yet); 3. `_check`: a WAL that already misses needed
entries, or a finite setting at or below either minimum, is unsafe. `--check` exits 1 when any topic is unsafe (2 when it cannot
tell); `--set` applies new values (incremental_alter_configs) only when every
topic is safe under them, and otherwise prints the computed safe minimum.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, Message
from confluent_kafka.admin import AdminClient

from infra.config import KwalConfig
from infra.exceptions import OpsError
from infra.topic_scan import admin_for, list_topics, read_to_end
from infra.topics import alter_topic_configs
from ops.checkpoints import CheckpointInfo, last_checkpoint
from ops.walscan import WalScan, scan_wal
from tn.logstore.kafka_backend.exceptions import RetentionUnsafeError
from tn.logstore.kafka_backend.replay import RecordInfo
from tn.logstore.kafka_backend.retention import (
    UNLIMITED,
    Retention,
    SafeRetention,
    check_retention,
    read_retention,
    safe_retention,
)

MARGIN = 2.0


@dataclass(frozen=True)
class Floor:
    """The least retention the TN's own schedule needs, whatever the topic holds now."""

    ms: int
    bytes: int
    why_ms: str
    why_bytes: str


def schedule_floor(cfg: KwalConfig, kind: str) -> Floor:
    """A WAL entry waits up to one checkpoint interval (or `checkpoint_wal_bytes`) before a
    checkpoint covers it, plus the retention floor's headroom (the TN raises retention
    only when that headroom is reached). A logtail record is needed by a bootstrapping CN
    from the PREVIOUS checkpoint's positions on (the TN truncates the logtail behind
    them): up to two intervals. Both times the margin."""
    interval_ms = int(cfg.tn.checkpoint_interval_s * 1000)
    headroom_ms = int(cfg.wal.retention_headroom_s * 1000)
    if kind == "wal":
        return Floor(
            ms=int(MARGIN * (interval_ms + headroom_ms)),
            bytes=int(MARGIN * (cfg.tn.checkpoint_wal_bytes + cfg.wal.retention_headroom_bytes)),
            why_ms=(
                f"WAL entries wait up to tn.checkpoint_interval_s={cfg.tn.checkpoint_interval_s:g} "
                f"s for a checkpoint, plus wal.retention_headroom_s={cfg.wal.retention_headroom_s:g}"
                f" s before the TN raises retention; replay needs them until then"
            ),
            why_bytes=(
                f"up to tn.checkpoint_wal_bytes={cfg.tn.checkpoint_wal_bytes} bytes of WAL wait "
                f"for a checkpoint, plus wal.retention_headroom_bytes="
                f"{cfg.wal.retention_headroom_bytes}; replay needs them until then"
            ),
        )
    return Floor(
        ms=int(MARGIN * 2 * interval_ms),
        bytes=0,
        why_ms=(
            f"a bootstrapping CN reads from the previous checkpoint's positions, up to two "
            f"checkpoint intervals (tn.checkpoint_interval_s={cfg.tn.checkpoint_interval_s:g} s)"
            " old"
        ),
        why_bytes="",
    )


@dataclass
class TopicRetention:
    topic: str
    kind: str  # "wal" | "logtail"
    ms: int | None = None  # current retention.ms (None: could not be read)
    bytes: int | None = None
    min_ms: int = 0  # a finite retention.ms must be > min_ms
    min_bytes: int = 0  # a finite retention.bytes must be > min_bytes
    needed_from: dict[int, int] = field(default_factory=dict)  # partition -> first needed offset
    safe: bool | None = None  # None: cannot tell
    message: str = ""
    computed: SafeRetention | None = field(default=None, repr=False)
    floor: Floor | None = field(default=None, repr=False)
    lost: str = ""  # the WAL already misses entries it needs (why)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("computed")
        d.pop("floor")
        d["needed_from"] = {str(k): v for k, v in self.needed_from.items()}
        return d


def logtail_topics(cfg: KwalConfig, admin: AdminClient, timeout_s: float) -> list[str]:
    prefix = cfg.topics.name("logtail.")
    return [t for t in list_topics(admin, timeout_s) if t.startswith(prefix)]


def cn_group_offsets(
    cfg: KwalConfig, admin: AdminClient, timeout_s: float
) -> tuple[dict[str, dict[str, int]], str]:
    """CN consumer groups (`<prefix>.cn.<name>`) -> topic -> committed offset (partition 0),
    and an error note ('' when the groups could be listed)."""
    prefix = cfg.topics.name("cn")
    try:
        listed = admin.list_consumer_groups(request_timeout=timeout_s).result(timeout=timeout_s)
    except KafkaException as e:
        return {}, f"cannot list consumer groups: {e}"
    out: dict[str, dict[str, int]] = {}
    for g in sorted(listed.valid, key=lambda g: g.group_id):
        gid = g.group_id
        if gid != prefix and not gid.startswith(prefix + "."):
            continue
        try:
            futs = admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(gid)], request_timeout=timeout_s
            )
            res = futs[gid].result(timeout=timeout_s)
        except KafkaException as e:
            return out, f"cannot read offsets of group {gid}: {e}"
        out[gid] = {
            str(tp.topic): int(tp.offset)
            for tp in (res.topic_partitions or [])
            if tp.offset is not None and tp.offset >= 0
        }
    return out, ""


def _logtail_infos(
    cfg: KwalConfig, topic: str, needed_from: int, timeout_s: float
) -> tuple[list[RecordInfo], int]:
    """Records of a (1-partition) logtail topic from `needed_from` on, all marked needed."""
    infos: list[RecordInfo] = []

    def on_msg(msg: Message) -> None:
        _, ts = msg.timestamp()
        off = int(msg.offset() or 0)
        infos.append(RecordInfo(0, off, 1, int(ts), len(msg.value() or b"")))

    ends = read_to_end(cfg, topic, [0], on_msg, timeout_s, start={0: needed_from})
    return infos, ends[0].low


def _check(tr: TopicRetention, retention: Retention, safe: SafeRetention) -> tuple[bool, str]:
    """(safe?, message) for one topic under `retention`: 1. entries already lost, 2. the
    schedule's floor, 3. what the topic holds now (with margin)."""
    if tr.lost:
        return False, f"{tr.kind} topic {tr.topic} already misses entries replay needs: {tr.lost}"
    floor = tr.floor
    if floor is not None:
        for setting, value, least, why in (
            ("retention.ms", retention.ms, floor.ms, floor.why_ms),
            ("retention.bytes", retention.bytes, floor.bytes, floor.why_bytes),
        ):
            if value != UNLIMITED and least and value <= least:
                return False, (
                    f"{tr.kind} topic {tr.topic}: {setting}={value} could delete records still "
                    f"needed: {why} (with margin {MARGIN:g}: {setting} > {least}, or -1)"
                )
    try:
        check = check_retention(tr.topic, retention, safe)
    except RetentionUnsafeError as e:
        msg = str(e)
        if tr.kind == "logtail":
            value = retention.ms if e.setting == "retention.ms" else retention.bytes
            need = safe.min_ms if e.setting == "retention.ms" else safe.min_bytes
            msg = (
                f"logtail topic {tr.topic} has {e.setting}={value}, but records a CN may still "
                f"read (from offset {tr.needed_from.get(0, 0)}) need {e.setting} > {need}; "
                f"Kafka could delete them. Set {e.setting}=-1 or checkpoint more often."
            )
        return False, msg
    return True, check.warning or "unlimited"


def assess(
    cfg: KwalConfig,
    admin: AdminClient,
    scan: WalScan,
    ckpt: CheckpointInfo | None,
    groups: dict[str, dict[str, int]],
    timeout_s: float,
) -> list[TopicRetention]:
    """Steps 1-3 of the module docstring for the WAL topic and every logtail topic."""
    out: list[TopicRetention] = []
    safes: dict[str, SafeRetention] = {}
    if scan.exists:
        tr = TopicRetention(scan.topic, "wal")
        safe = safe_retention(scan.infos, scan.truncated, margin=MARGIN)
        safes[tr.topic] = safe
        needed: dict[int, int] = {}
        for info in scan.infos:
            if info.max_lsn > scan.truncated:
                needed[info.partition] = min(needed.get(info.partition, info.offset), info.offset)
        tr.needed_from = needed
        tr.lost = scan.replay_error
        out.append(tr)
    for topic in logtail_topics(cfg, admin, timeout_s):
        tr = TopicRetention(topic, "logtail")
        start = 0
        if ckpt is not None:
            start = ckpt.logtail_offsets.get(topic, 0)
        for offsets in groups.values():
            if topic in offsets:
                start = min(start, offsets[topic])
        infos, low = _logtail_infos(cfg, topic, start, timeout_s)
        tr.needed_from = {0: max(start, low)}
        safes[topic] = safe_retention(infos, 0, margin=MARGIN)
        out.append(tr)
    for tr in out:
        safe = safes[tr.topic]
        tr.floor = schedule_floor(cfg, tr.kind)
        tr.min_ms = max(safe.min_ms, tr.floor.ms)
        tr.min_bytes = max(safe.min_bytes, tr.floor.bytes)
        tr.computed = safe
        try:
            current = read_retention(admin, tr.topic, timeout_s)
        except (KafkaException, ValueError, TimeoutError) as e:
            tr.message = f"cannot read the retention of {tr.topic}: {e}"
            continue
        tr.ms, tr.bytes = current.ms, current.bytes
        tr.safe, tr.message = _check(tr, current, safe)
    return out


def collect(
    cfg: KwalConfig, timeout_s: float
) -> tuple[list[TopicRetention], CheckpointInfo | None]:
    admin = admin_for(cfg, timeout_s)
    scan = scan_wal(cfg, max(timeout_s, 30.0))
    ckpt = last_checkpoint(cfg)
    groups, note = cn_group_offsets(cfg, admin, timeout_s)
    results = assess(cfg, admin, scan, ckpt, groups, timeout_s)
    if note:  # a lagging CN's needs are unknown: a logtail topic cannot be called safe
        for tr in results:
            if tr.kind == "logtail" and tr.safe:
                tr.safe, tr.message = None, f"{note} (CN positions unknown)"
    return results, ckpt


def parse_set(spec: str | None, ms: int | None, nbytes: int | None) -> dict[str, int]:
    """`ms=...,bytes=...` plus `--set-ms/--set-bytes` -> {"retention.ms": v, ...}."""
    out: dict[str, int] = {}
    for part in (spec or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip().removeprefix("retention.")
        if not sep or name not in ("ms", "bytes"):
            raise OpsError(f"--set takes ms=<int>,bytes=<int> (got {part!r})")
        try:
            out[f"retention.{name}"] = int(value)
        except ValueError as e:
            raise OpsError(f"--set {name}: not an integer: {value!r}") from e
    if ms is not None:
        out["retention.ms"] = ms
    if nbytes is not None:
        out["retention.bytes"] = nbytes
    for setting, v in out.items():
        if v < UNLIMITED or v == 0:
            raise OpsError(f"{setting}={v}: use -1 (unlimited) or a positive value")
    return out


def apply_retention(
    admin: AdminClient, topics: list[str], values: dict[str, int], timeout_s: float
) -> None:
    """Set `values` on `topics`; OpsError when the broker cannot."""
    try:
        alter_topic_configs(admin, topics, values, timeout_s)
    except KafkaException as e:
        raise OpsError(f"the broker did not alter topic configs: {e}") from e


def _line(tr: TopicRetention) -> str:
    state = {True: "safe", False: "UNSAFE", None: "unknown"}[tr.safe]
    return (
        f"{state:<7} {tr.kind:<7} {tr.topic}  retention.ms={tr.ms} retention.bytes={tr.bytes}  "
        f"(safe: ms > {tr.min_ms}, bytes > {tr.min_bytes})  {tr.message}"
    )


def run(args: Any, cfg: KwalConfig) -> int:
    timeout_s = float(getattr(args, "timeout", 10.0))
    try:
        values = parse_set(
            getattr(args, "set", None),
            getattr(args, "set_ms", None),
            getattr(args, "set_bytes", None),
        )
        if values and getattr(args, "check", False):
            raise OpsError("--check and --set* are exclusive")
        results, _ = collect(cfg, timeout_s)
        if not values:  # --check (the default)
            for tr in results:
                print(_line(tr))
            if not results:
                print("no WAL or logtail topics yet: nothing to check")
            if any(tr.safe is False for tr in results):
                return 1
            return 2 if any(tr.safe is None for tr in results) else 0
        refused: list[str] = []
        for tr in results:
            if tr.ms is None or tr.bytes is None or tr.safe is None:
                refused.append(f"{tr.topic}: cannot tell what is safe: {tr.message}")
                continue
            proposed = Retention(
                ms=values.get("retention.ms", tr.ms), bytes=values.get("retention.bytes", tr.bytes)
            )
            assert tr.computed is not None
            ok, msg = _check(tr, proposed, tr.computed)
            if not ok:
                refused.append(
                    f"{tr.topic}: {msg} (safe minimum now: retention.ms >= {tr.min_ms + 1}, "
                    f"retention.bytes >= {tr.min_bytes + 1}, or -1)"
                )
        if refused:
            print(
                "kwal ops retention: refused, the new settings are not safe now:", file=sys.stderr
            )
            for line in refused:
                print(f"  {line}", file=sys.stderr)
            return 1
        if not results:
            print("no WAL or logtail topics yet: nothing to set")
            return 0
        admin = admin_for(cfg, timeout_s)
        apply_retention(admin, [tr.topic for tr in results], values, timeout_s)
        shown = ", ".join(f"{k}={v}" for k, v in values.items())
        for tr in results:
            print(f"set {shown} on {tr.kind} topic {tr.topic}")
        return 0
    except OpsError as e:
        print(f"kwal ops retention: {e}", file=sys.stderr)
        return 2
