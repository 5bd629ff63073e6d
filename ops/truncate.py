"""`kwal ops truncate`: truncate the WAL to the last checkpoint's LSN, now.

It never opens a `KafkaDriver` (that would claim an epoch and fence the running
TN). The meta protocol lets any process advance the truncation point: the
`truncated` key's readers take the MAXIMUM value they see (`meta.MetaState`), so
a record with a higher LSN moves the point up and a lower one is ignored. Steps:

1. find the last checkpoint (refuse when there is none) and scan the WAL
   read-only (`walscan`): the current truncation point T and the recoverable log;
2. refuse when the checkpoint's LSN C is above the log's contiguous end (the
   checkpoint would cover entries the WAL never held); nothing to do when C <= T;
3. produce `truncated -> {"lsn": C, "offsets": ...}` on the meta topic (acks=all;
   the offsets are step 4's prefixes, where a starting writer reads from), then read the
   meta topic up to that record's exact offset: when a writer recorded a higher
   point meanwhile, re-record that maximum so that the newest record of the key
   (the one compaction keeps) is never below the point (never backwards);
4. physically, where the broker has DeleteRecords (`kwal doctor`) and unless
   `--logical-only`: per partition, delete only the prefix of records whose
   LSNs are all <= C (seed 004's rule, `replay.deletable_offsets`, on the
   scanned records only: records written after the scan are never included).
"""

from __future__ import annotations

import sys
from typing import Any

from confluent_kafka import Producer, TopicPartition

from infra.config import KwalConfig
from infra.exceptions import OpsError
from infra.kafka_io import delete_records
from infra.topic_scan import admin_for
from ops.checkpoints import last_checkpoint
from ops.walscan import WalScan, scan_wal
from tn.logstore.kafka_backend.exceptions import KafkaLogError
from tn.logstore.kafka_backend.kio import read_until
from tn.logstore.kafka_backend.meta import TRUNCATED_KEY, MetaState, truncation_value
from tn.logstore.kafka_backend.replay import deletable_offsets


def record_truncation(
    cfg: KwalConfig, lsn: int, timeout_s: float, offsets: dict[int, int] | None = None
) -> int:
    """Steps 3: advance the durable truncation point to at least `lsn`, with the offsets a
    starting writer may read each partition from (`offsets`: valid for `lsn`); return the
    point."""
    producer = Producer(cfg.kafka_client(acks="all", **{"linger.ms": 0}))
    topic = cfg.topics.wal_meta
    starts = dict(offsets or {})

    def produce(value: int) -> int:
        out: list[Any] = []
        producer.produce(
            topic,
            key=TRUNCATED_KEY,
            value=truncation_value(value, starts),
            partition=0,
            on_delivery=lambda err, msg: out.append(err if err is not None else msg.offset()),
        )
        if producer.flush(timeout_s) != 0 or not out:
            raise OpsError(
                f"no acknowledgement for the truncation record on {topic} within {timeout_s:.0f}s"
            )
        if not isinstance(out[0], int):
            raise OpsError(f"recording the truncation point on {topic} failed: {out[0]}")
        return int(out[0])

    offset = produce(lsn)
    state = MetaState()
    try:
        for msg in read_until(cfg.kafka_client(), topic, {0: offset + 1}, timeout_s):
            state.apply(msg.key() or b"", msg.value())
    except KafkaLogError as e:
        raise OpsError(
            f"the truncation point is recorded, but re-reading {topic} failed: {e}"
        ) from e
    if state.truncated > lsn:
        for p, off in state.truncated_offsets.items():  # valid for the higher point too
            starts[p] = max(starts.get(p, 0), off)
        produce(state.truncated)
    return max(state.truncated, lsn)


def delete_prefixes(
    cfg: KwalConfig, scan: WalScan, lsn: int, timeout_s: float
) -> tuple[dict[int, int], list[str]]:
    """Step 4: DeleteRecords per partition up to the deletable offset; (done, errors)."""
    plan = deletable_offsets(scan.infos, lsn)
    lows = {p.partition: p.low for p in scan.partitions}
    todo = [
        TopicPartition(scan.topic, p, off)
        for p, off in sorted(plan.items())
        if off > lows.get(p, 0)
    ]
    if not todo:
        return {}, []
    done, failed = delete_records(admin_for(cfg, timeout_s), todo, timeout_s)
    errors = [f"DeleteRecords {tp.topic}/{tp.partition} before {tp.offset}: {e}" for tp, e in failed]
    return {tp.partition: tp.offset for tp in done}, errors


def physical_supported(cfg: KwalConfig, timeout_s: float) -> tuple[bool, str]:
    from infra import capabilities

    try:
        probe = capabilities.probe(cfg, timeout_s=timeout_s).delete_records
    except Exception as e:  # noqa: BLE001 - no probe, no deletion
        return False, f"doctor probe failed: {e}"
    return probe.works, probe.detail


def run(args: Any, cfg: KwalConfig) -> int:
    timeout_s = float(getattr(args, "timeout", 10.0))
    try:
        admin_for(cfg, timeout_s)
        ckpt = last_checkpoint(cfg)
        if ckpt is None:
            print(
                "kwal ops truncate: refused: there is no checkpoint yet, so nothing may be "
                "truncated (take a checkpoint first)",
                file=sys.stderr,
            )
            return 1
        scan = scan_wal(cfg, max(timeout_s, 30.0))
        if not scan.exists:
            print(
                f"kwal ops truncate: refused: the WAL topic {scan.topic} does not exist",
                file=sys.stderr,
            )
            return 1
        if scan.replay_error:
            print(
                f"kwal ops truncate: refused: the WAL is damaged: {scan.replay_error}",
                file=sys.stderr,
            )
            return 1
        if ckpt.lsn > scan.log_end:
            print(
                f"kwal ops truncate: refused: the last checkpoint ({ckpt.key}) covers LSN {ckpt.lsn}, "
                f"but the WAL holds a contiguous log only through {scan.log_end}",
                file=sys.stderr,
            )
            return 1
        if ckpt.lsn <= scan.truncated:
            print(
                f"WAL {scan.topic} is already truncated to {scan.truncated} "
                f"(last checkpoint covers LSN {ckpt.lsn}): nothing to do"
            )
            return 0
        starts = {
            p: off
            for p, off in deletable_offsets(scan.infos, ckpt.lsn).items()
            if off > 0
        }
        point = record_truncation(cfg, ckpt.lsn, timeout_s, starts)
        print(
            f"WAL {scan.topic}: truncation point {scan.truncated} -> {point} "
            f"(last checkpoint {ckpt.key}, LSN {ckpt.lsn})"
        )
        if getattr(args, "logical_only", False):
            print("physical deletion skipped (--logical-only): truncation is logical")
            return 0
        works, detail = physical_supported(cfg, timeout_s)
        if not works:
            print(f"truncation is logical only: the broker lacks DeleteRecords ({detail})")
            return 0
        done, errors = delete_prefixes(cfg, scan, ckpt.lsn, timeout_s)
        for p, off in sorted(done.items()):
            print(f"deleted partition {p} records before offset {off}")
        if not done and not errors:
            print("no partition prefix holds only LSNs at or below the point: nothing deleted")
        for line in errors:
            print(f"warning: {line} (the point is recorded; retry later)", file=sys.stderr)
        return 0
    except OpsError as e:
        print(f"kwal ops truncate: {e}", file=sys.stderr)
        return 2
