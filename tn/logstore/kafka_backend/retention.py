"""The retention guard: Kafka retention must never delete an entry above the truncation point.

Only truncation (after a checkpoint) may remove WAL entries. A finite
`retention.ms` or `retention.bytes` on the WAL topic deletes records by age or
size whatever the checkpoint says, so:

1. `read_retention` reads the topic's `retention.ms` / `retention.bytes`
   (AdminClient.describe_configs; -1 means unlimited);
2. `safe_retention` computes, from the (partition, offset) map, the smallest
   settings that keep every record holding an entry above the truncation
   point: its age (ms) and, per partition, the bytes from it to the end, times
   a margin for the log that will grow before the next checkpoint;
3. `check_retention` refuses (`RetentionUnsafeError`, naming the setting) when
   a finite setting is already below what is needed, and warns loudly when a
   finite setting is safe now but would become unsafe if checkpoints stalled.

`kwal ops retention` can call `safe_retention` / `check_retention` directly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient, ConfigResource

from tn.logstore.kafka_backend.exceptions import RetentionUnsafeError
from tn.logstore.kafka_backend.replay import RecordInfo

log = logging.getLogger(__name__)

UNLIMITED = -1


@dataclass(frozen=True)
class Retention:
    ms: int  # -1 = unlimited
    bytes: int  # -1 = unlimited (per partition)


@dataclass(frozen=True)
class SafeRetention:
    """The least retention that keeps every entry above the truncation point, with margin."""

    min_ms: int  # 0 when nothing above the truncation point is stored
    min_bytes: int  # per partition; 0 when nothing is needed
    oldest_needed_age_ms: int
    needed_bytes: dict[int, int]  # partition -> bytes from the oldest needed record to the end


@dataclass(frozen=True)
class RetentionCheck:
    ok: bool
    warning: str = ""


def read_retention(admin: AdminClient, topic: str, timeout_s: float = 10.0) -> Retention:
    """Step 1: the WAL topic's retention settings (KafkaException when the broker cannot say)."""
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([res])[res].result(timeout=timeout_s)

    def value(name: str) -> int:
        entry = configs.get(name)
        if entry is None or entry.value is None:
            return UNLIMITED
        return int(entry.value)

    return Retention(ms=value("retention.ms"), bytes=value("retention.bytes"))


def safe_retention(
    records: Iterable[RecordInfo], truncated: int, now_ms: int | None = None, margin: float = 2.0
) -> SafeRetention:
    """Step 2: retention settings that keep every record holding an LSN > `truncated`."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    by_part: dict[int, list[RecordInfo]] = {}
    for r in records:
        by_part.setdefault(r.partition, []).append(r)
    oldest_ts: int | None = None
    needed: dict[int, int] = {}
    for p, rows in by_part.items():
        rows.sort(key=lambda r: r.offset)
        first_needed = next((i for i, r in enumerate(rows) if r.max_lsn > truncated), None)
        if first_needed is None:
            continue
        tail = rows[first_needed:]
        needed[p] = sum(r.size for r in tail)
        ts = min(r.timestamp_ms for r in tail if r.max_lsn > truncated)
        oldest_ts = ts if oldest_ts is None else min(oldest_ts, ts)
    age = 0 if oldest_ts is None else max(0, now_ms - oldest_ts)
    return SafeRetention(
        min_ms=int(age * margin) if needed else 0,
        min_bytes=int(max(needed.values(), default=0) * margin),
        oldest_needed_age_ms=age,
        needed_bytes=needed,
    )


def check_retention(topic: str, retention: Retention, safe: SafeRetention) -> RetentionCheck:
    """Step 3: refuse (raise) when retention already threatens needed entries; warn when finite."""
    if retention.ms != UNLIMITED and retention.ms <= safe.min_ms:
        raise RetentionUnsafeError(
            "retention.ms",
            f"WAL topic {topic} has retention.ms={retention.ms}, but the oldest entry above the "
            f"truncation point is {safe.oldest_needed_age_ms} ms old (safe minimum with margin: "
            f"{safe.min_ms}); Kafka could delete entries not yet checkpointed. Set retention.ms=-1 "
            "or checkpoint more often.",
        )
    if retention.bytes != UNLIMITED and retention.bytes <= safe.min_bytes:
        raise RetentionUnsafeError(
            "retention.bytes",
            f"WAL topic {topic} has retention.bytes={retention.bytes}, but a partition holds "
            f"{max(safe.needed_bytes.values(), default=0)} bytes above the truncation point (safe "
            f"minimum with margin: {safe.min_bytes}); Kafka could delete entries not yet "
            "checkpointed. Set retention.bytes=-1 or checkpoint more often.",
        )
    finite = [
        f"{name}={value}"
        for name, value in (("retention.ms", retention.ms), ("retention.bytes", retention.bytes))
        if value != UNLIMITED
    ]
    if finite:
        return RetentionCheck(
            ok=True,
            warning=(
                f"WAL topic {topic} has finite {', '.join(finite)}: safe now, but if checkpoints "
                "stall Kafka will delete WAL entries that are not checkpointed. Prefer -1 (only "
                "truncation removes WAL records)."
            ),
        )
    return RetentionCheck(ok=True)


