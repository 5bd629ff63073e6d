"""`kwal checkpoint now` and `kwal checkpoint list` (called by ops/cli.py).

`now` works on an offline WAL (the TN stopped): it recovers the engine from
cfg.wal (file dir or Kafka) + cfg.objectstore, takes one checkpoint (dump,
FLUSH entry, manifest, WAL truncation) and exits. A running TN checkpoints in
the background (CheckpointRunner.start).

`list` prints each complete checkpoint: ts, WAL LSN, object count, bytes.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from infra.config import KwalConfig
from infra.objectstore import open_store
from tn.checkpoint.manifest import Manifest, list_manifests


def _row(m: Manifest) -> dict[str, Any]:
    return {
        "ts": m.ts,
        "lsn": m.lsn,
        "objects": len(m.objects),
        "bytes": m.object_bytes,
        "written": len(m.written),
        "manifest": m.key,
        "created_at": m.created_at,
    }


def run_now(args: Any, cfg: KwalConfig) -> int:
    from tn.checkpoint.recovery import recover
    from tn.logstore.driver import LogStore
    from tn.service.main import open_driver

    store = open_store(cfg.objectstore)
    t0 = time.perf_counter()
    log = LogStore(open_driver(cfg))
    try:
        rec = recover(log, store, commit_queue=cfg.tn.commit_queue)
        try:
            m = rec.runner().checkpoint()
        finally:
            rec.engine.close()
    finally:
        log.close()
    out: dict[str, Any] = {"checkpoint": None, "replayed": rec.replayed}
    if m is not None:
        out["checkpoint"] = _row(m)
        out["truncated_lsn"] = m.lsn
    out["seconds"] = round(time.perf_counter() - t0, 3)
    if getattr(args, "json", False):
        print(json.dumps(out))
    elif m is None:
        print("nothing to checkpoint (no change since the newest checkpoint)")
    else:
        print(
            f"checkpoint ts={m.ts} lsn={m.lsn} objects={len(m.objects)} "
            f"bytes={m.object_bytes} written={len(m.written)} ({out['seconds']} s)"
        )
    return 0


def run_list(args: Any, cfg: KwalConfig) -> int:
    store = open_store(cfg.objectstore)
    rows = [_row(m) for m in list_manifests(store)]
    if getattr(args, "json", False):
        print(json.dumps(rows))
        return 0
    if not rows:
        print("no checkpoints", file=sys.stderr)
        return 0
    print(f"{'ts':>20} {'lsn':>10} {'objects':>8} {'bytes':>12}  manifest")
    for r in rows:
        print(f"{r['ts']:>20} {r['lsn']:>10} {r['objects']:>8} {r['bytes']:>12}  {r['manifest']}")
    return 0
