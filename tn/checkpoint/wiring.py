"""Wiring the checkpoint layer into the TN process (for tn/service/main.py).

log = LogStore(open_driver(cfg))
rec = recover_from_config(log, cfg)          # instead of Engine.recover(log)
engine = rec.engine
logtail = attach_logtail(engine, cfg, republish=...)
runner = start_checkpoints(rec, cfg, logtail=logtail)
...
runner.stop(); engine.close(); log.close()
"""

from __future__ import annotations

from typing import Any

from infra.config import KwalConfig
from infra.objectstore import open_store
from tn.checkpoint.recovery import Recovered, recover
from tn.checkpoint.runner import CheckpointRunner
from tn.logstore.driver import LogStore
from tn.logtail.truncation import LogtailTruncator
from tn.logtail.wiring import Logtail


def recover_from_config(log: LogStore, cfg: KwalConfig, **engine_kw: Any) -> Recovered:
    """The engine from cfg.objectstore's newest checkpoint + the WAL after it."""
    engine_kw.setdefault("commit_queue", cfg.tn.commit_queue)
    engine_kw.setdefault("bits_per_key", cfg.tn.pk_filter_bits_per_key)
    engine_kw.setdefault("cache_blocks", cfg.tn.object_cache_blocks)
    return recover(log, open_store(cfg.objectstore), **engine_kw)


def start_checkpoints(rec: Recovered, cfg: KwalConfig, logtail: Logtail | None = None) -> CheckpointRunner:
    """The background checkpoint task: every cfg.tn.checkpoint_interval_s, or sooner
    once about cfg.tn.checkpoint_wal_bytes of WAL follow the last checkpoint. With a
    `logtail`, each checkpoint pushes BlockMeta/Checkpoint records, records the
    logtail's offsets in its manifest, and truncates the logtail topics behind it."""
    kw: dict[str, Any] = {}
    if logtail is not None:
        kw = {
            "publish": logtail.publisher.publish_records,
            "logtail_offsets": logtail.publisher.offsets,
            "truncate_logtail": LogtailTruncator(cfg),
        }
    return rec.runner(
        interval_s=cfg.tn.checkpoint_interval_s,
        wal_bytes=cfg.tn.checkpoint_wal_bytes,
        put_workers=cfg.tn.checkpoint_put_workers,
        **kw,
    ).start()
