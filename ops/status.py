"""`kwal ops status`: one screen for an operator (or `--json` for tools).

Read-only throughout (never opens a `KafkaDriver`, which would fence the TN):

1. the broker answers (bounded; one line and exit 2 otherwise);
2. the WAL scan (`walscan.scan_wal`): partitions, watermarks, LSN ranges, the
   truncation point, the current epoch and writer, the recoverable log;
3. truncation mode: physical where `kwal doctor` finds DeleteRecords, else
   logical (skipped with `--no-probe`: "unknown");
4. the in-flight window, from the TN's status record on the meta topic when it
   publishes one (`walscan.STATUS_KEY`), else "n/a (TN not reporting)";
5. the last checkpoint (`checkpoints.last_checkpoint`);
6. logtail lag per CN consumer group (`<prefix>.cn.<name>`): the end found by
   reading past the high watermark (see `walscan`) minus the committed offset;
7. retention of the WAL and logtail topics and whether it is safe
   (`ops.retention.assess`);
8. the watermark lag of CNs that report on the ops topic (the Spark CN:
   `ops.cn_status`).

Each section that fails is reported in `errors` and the rest is still shown.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from confluent_kafka import Message

from infra.cn_status import read_statuses
from infra.config import KwalConfig
from infra.exceptions import OpsError
from infra.topic_scan import END_METHOD, admin_for, read_to_end, topic_partitions
from ops.checkpoints import CheckpointInfo, last_checkpoint
from ops.retention import assess, cn_group_offsets
from ops.walscan import WalScan, scan_wal

STATUS_FRESH_S = 60.0  # an older TN status record is shown as stale


def _noop(_msg: Message) -> None:
    return None


def topic_end(cfg: KwalConfig, topic: str, timeout_s: float) -> int:
    """The end offset of partition 0 of `topic`, found past the reported high watermark."""
    return read_to_end(cfg, topic, [0], _noop, timeout_s, tail_only=True)[0].end


def window_section(scan: WalScan, cfg: KwalConfig) -> dict[str, Any]:
    st = scan.tn_status
    if not st:
        return {"available": False, "note": "n/a (TN not reporting)"}
    age_s = max(0.0, time.time() - float(st.get("ts_ms", 0)) / 1000.0)
    last = int(st.get("last_lsn", 0))
    acked = int(st.get("acked_lsn", 0))
    out: dict[str, Any] = {
        "available": True,
        "writer": st.get("writer_id", ""),
        "epoch": st.get("epoch", 0),
        "last_lsn": last,
        "acked_lsn": acked,
        "in_flight": max(0, last - acked),
        "limit": int(st.get("window", cfg.wal.window)),
        "age_s": round(age_s, 1),
        "stale": age_s > STATUS_FRESH_S or st.get("epoch", 0) != scan.epoch,
        # the TN's retention floor (tn/logstore/kafka_backend/retention_floor.py)
        "retention_floor": st.get("retention_floor"),
    }
    return out


def collect(cfg: KwalConfig, timeout_s: float, probe: bool = True) -> dict[str, Any]:
    admin = admin_for(cfg, timeout_s)
    errors: list[str] = []
    out: dict[str, Any] = {
        "bootstrap": cfg.bootstrap,
        "prefix": cfg.topics.prefix,
        "errors": errors,
    }
    # 2. WAL
    scan: WalScan | None = None
    try:
        scan = scan_wal(cfg, max(timeout_s, 30.0))
        out["wal"] = scan.to_json()
    except OpsError as e:
        errors.append(f"wal: {e}")
        out["wal"] = None
    # 3. truncation mode
    if not probe:
        mode, detail = "unknown", "doctor probe skipped (--no-probe)"
    else:
        from ops.truncate import physical_supported

        works, detail = physical_supported(cfg, timeout_s)
        mode = "physical" if works else "logical"
        if not works:
            detail = (
                "the broker lacks DeleteRecords: truncation of the WAL and of the logtail topics "
                f"is logical only, their records stay ({detail})"
            )
    out["truncation"] = {
        "point": scan.truncated if scan else None,
        "mode": mode,
        "detail": detail,
    }
    # 4. window
    out["window"] = window_section(scan, cfg) if scan else {"available": False, "note": "n/a"}
    # 5. checkpoint
    ckpt: CheckpointInfo | None = None
    try:
        ckpt = last_checkpoint(cfg)
        out["checkpoint"] = ckpt.to_json() if ckpt else None
    except OpsError as e:
        errors.append(f"checkpoint: {e}")
        out["checkpoint"] = None
    # 6. CN lag
    groups, note = cn_group_offsets(cfg, admin, timeout_s)
    if note:
        errors.append(f"consumers: {note}")
    lag: list[dict[str, Any]] = []
    ends: dict[str, int] = {}
    for group, offsets in groups.items():
        for topic, committed in sorted(offsets.items()):
            try:
                if topic not in ends:
                    if topic_partitions(admin, topic, timeout_s) is None:
                        continue
                    ends[topic] = topic_end(cfg, topic, timeout_s)
            except OpsError as e:
                errors.append(f"consumers: {e}")
                continue
            end = ends[topic]
            lag.append(
                {
                    "group": group,
                    "topic": topic,
                    "committed": committed,
                    "end": end,
                    "lag": max(0, end - committed),
                }
            )
    out["consumers"] = lag
    out["consumers_end_method"] = END_METHOD
    # 8. CN watermark lag (CNs without a consumer group: the Spark CN)
    try:
        present = topic_partitions(admin, cfg.topics.ops, timeout_s) is not None
        out["cn_status"] = read_statuses(cfg, timeout_s) if present else []
    except Exception as e:  # noqa: BLE001 - one section failing must not hide the others
        errors.append(f"cn status: {type(e).__name__}: {e}")
        out["cn_status"] = []
    # 7. retention
    try:
        if scan is None:
            raise OpsError("no WAL scan")
        out["retention"] = [
            tr.to_json() for tr in assess(cfg, admin, scan, ckpt, groups, timeout_s)
        ]
    except OpsError as e:
        errors.append(f"retention: {e}")
        out["retention"] = []
    return out


def _fmt_ranges(ranges: list[list[int]], limit: int = 4) -> str:
    if not ranges:
        return "-"
    parts = [f"{a}-{b}" if a != b else str(a) for a, b in ranges[:limit]]
    if len(ranges) > limit:
        parts.append(f"... ({len(ranges)} ranges, last ends {ranges[-1][1]})")
    return ", ".join(parts)


def render(st: dict[str, Any]) -> str:
    lines = [f"kwal ops status — Kafka {st['bootstrap']}, topic prefix {st['prefix']}"]
    wal = st.get("wal")
    lines.append("")
    if wal is None:
        lines.append("WAL: unavailable")
    elif not wal["exists"]:
        lines.append(f"WAL {wal['topic']}: does not exist yet")
    else:
        lines.append(
            f"WAL {wal['topic']}: epoch {wal['epoch']} (writer {wal['writer'] or '-'}), "
            f"recoverable log {wal['truncated'] + 1}..{wal['log_end']}"
            + (f", tail dropped {wal['tail_dropped']}" if wal["tail_dropped"] else "")
            + (f", zombie entries {wal['zombies_ignored']}" if wal["zombies_ignored"] else "")
        )
        if wal["replay_error"]:
            lines.append(f"  DAMAGED: {wal['replay_error']}")
        lines.append(
            f"  {'part':>4} {'low':>8} {'high*':>8} {'end':>8} {'records':>8} {'bytes':>10}  LSN ranges"
        )
        for p in wal["partitions"]:
            lines.append(
                f"  {p['partition']:>4} {p['low']:>8} {p['high_reported']:>8} {p['end']:>8} "
                f"{p['records']:>8} {p['bytes']:>10}  {_fmt_ranges(p['lsn_ranges'])}"
            )
        lines.append(f"  (*high: as the broker reports it; end: {wal['end_method']})")
        if wal["truncated"]:
            lines.append(
                f"  (LSNs <= {wal['truncated']} are truncated; their records stay until deleted)"
            )
    tr = st["truncation"]
    lines.append(f"Truncation point: {tr['point']}  mode: {tr['mode']}  {tr['detail']}")
    w = st["window"]
    if w.get("available"):
        lines.append(
            f"In-flight window: {w['in_flight']} of {w['limit']} (last {w['last_lsn']}, acked "
            f"{w['acked_lsn']}, reported {w['age_s']}s ago{', STALE' if w['stale'] else ''})"
        )
        floor = w.get("retention_floor")
        if floor and (floor.get("raised") or floor.get("alarm")):
            lines.append(
                f"Retention floor: raised {floor['raised']} over the operator's "
                f"{floor['operator']} (checkpoints are behind)"
            )
            if floor.get("alarm"):
                lines.append(f"  ALARM: {floor['alarm']}")
    else:
        lines.append(f"In-flight window: {w['note']}")
    ck = st.get("checkpoint")
    if ck:
        age = "unknown age" if ck["age_s"] is None else f"{ck['age_s']:.0f}s ago"
        lines.append(
            f"Last checkpoint: ts {ck['ts']}, LSN {ck['lsn']}, {age}, {ck['objects']} objects, "
            f"{ck['bytes']} bytes ({ck['key']})"
        )
    else:
        lines.append("Last checkpoint: no checkpoint yet")
    lines.append("CN consumer lag (end found past the high watermark):")
    if not st["consumers"]:
        lines.append("  no CN consumer groups")
    for c in st["consumers"]:
        lines.append(
            f"  {c['group']}  {c['topic']}  committed {c['committed']}  end {c['end']}  lag {c['lag']}"
        )
    lines.extend(render_statuses(st.get("cn_status", [])))
    lines.append("Retention:")
    if not st["retention"]:
        lines.append("  no WAL or logtail topics")
    for r in st["retention"]:
        state = {True: "safe", False: "UNSAFE", None: "unknown"}[r["safe"]]
        lines.append(
            f"  {state:<7} {r['kind']:<7} {r['topic']}  ms={r['ms']} bytes={r['bytes']} "
            f"(needs ms > {r['min_ms']}, bytes > {r['min_bytes']})"
        )
        if r["safe"] is not True or r["message"] != "unlimited":
            lines.append(f"          {r['message']}")
    for e in st["errors"]:
        lines.append(f"error: {e}")
    return "\n".join(lines)


def run(args: Any, cfg: KwalConfig) -> int:
    timeout_s = float(getattr(args, "timeout", 10.0))
    try:
        st = collect(cfg, timeout_s, probe=not getattr(args, "no_probe", False))
    except OpsError as e:
        print(f"kwal ops status: {e}", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        print(json.dumps(st, sort_keys=True))
    else:
        print(render(st))
    return 1 if st["errors"] else 0


def render_statuses(statuses: list[dict[str, Any]]) -> list[str]:
    lines = ["CN watermark lag (reported on the ops topic):"]
    if not statuses:
        lines.append("  no CN reporting")
    for s in statuses:
        lag = "n/a (no watermark yet)" if s["lag_s"] is None else f"{s['lag_s']}s"
        lines.append(
            f"  {s['cn']} {s['name']}  watermark {s['watermark']}  lag {lag}  batch {s['batch_id']}"
            f"  reported {s['age_s']}s ago{', STALE' if s['stale'] else ''}"
        )
    return lines
