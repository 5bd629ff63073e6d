"""The last checkpoint, as operators need it: ts, the WAL LSN it covers, age and size.

Reads the newest manifest from the object store through `tn.checkpoint.manifest`
(a manifest exists only for a complete checkpoint). `None` means "no checkpoint
yet"; an unreadable store raises `OpsError` with one line to print.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from infra.config import KwalConfig
from infra.exceptions import OpsError


@dataclass(frozen=True)
class CheckpointInfo:
    key: str
    ts: int  # t1: everything committed at or below it is in the checkpoint
    lsn: int  # the WAL LSN it covers (truncation may go up to it)
    prev_ts: int
    created_at: float  # unix seconds (0.0 when the manifest does not say)
    objects: int
    bytes: int  # sum of every live object the checkpoint references
    logtail_offsets: dict[str, int] = field(default_factory=dict)

    def age_s(self, now: float | None = None) -> float | None:
        if not self.created_at:
            return None
        return max(0.0, (time.time() if now is None else now) - self.created_at)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["age_s"] = self.age_s()
        return d


def last_checkpoint(cfg: KwalConfig) -> CheckpointInfo | None:
    """The newest complete checkpoint in `cfg.objectstore`, or None when there is none."""
    try:
        from infra.objectstore import open_store
        from tn.checkpoint.manifest import newest_manifest
    except ImportError as e:  # pragma: no cover - the checkpoint package ships with kwal
        raise OpsError(f"checkpoints are not available in this install: {e}") from e
    try:
        store = open_store(cfg.objectstore)
        manifest = newest_manifest(store)
    except Exception as e:  # noqa: BLE001 - any store failure is one line for the operator
        raise OpsError(f"cannot read checkpoints from {cfg.objectstore.url}: {e}") from e
    if manifest is None:
        return None
    return CheckpointInfo(
        key=manifest.key,
        ts=manifest.ts,
        lsn=manifest.lsn,
        prev_ts=manifest.prev_ts,
        created_at=float(manifest.created_at or 0.0),
        objects=len(manifest.objects),
        bytes=manifest.object_bytes,
        logtail_offsets=dict(manifest.logtail_offsets),
    )
