"""Checkpoints to object storage, WAL truncation and recovery (DESIGN "Data flow" 6-7).

    rec = recover(log, store)              # newest manifest + WAL since its LSN
    runner = rec.runner(interval_s=60, wal_bytes=256 << 20).start()
    engine = rec.engine                    # serving
    ...
    runner.checkpoint()                    # one checkpoint now (also the background task)
    compact_block(engine, store, "db", "t", block_id) / merge_segment(..., segment_id)
    attach_object(engine, store, "db", "t", key)   # a large transaction (metadata only)
    (each takes publish=LogtailPublisher.publish_records to tell CNs about new blocks)

Modules: `runner` (the steps), `dump` (Parquet layout), `manifest`, `recovery`,
`compaction`, `commands` (CLI), `exceptions`.
"""

from tn.checkpoint.compaction import attach_object, compact_block, merge_segment
from tn.checkpoint.exceptions import CheckpointError, InjectedCrash, LargeTxnError
from tn.checkpoint.manifest import Manifest, list_manifests, newest_manifest
from tn.checkpoint.recovery import Recovered, recover
from tn.checkpoint.runner import STEPS, CheckpointRunner

__all__ = [
    "STEPS",
    "CheckpointError",
    "CheckpointRunner",
    "InjectedCrash",
    "LargeTxnError",
    "Manifest",
    "Recovered",
    "attach_object",
    "compact_block",
    "list_manifests",
    "merge_segment",
    "newest_manifest",
    "recover",
]
