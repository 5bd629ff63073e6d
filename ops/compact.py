"""`kwal ops compact [--table db.t] [--json]`: run the TN's compaction policy now.

The running TN does the work (infra.control: a command on the ops topic); this
command prints what it compacted: per table, the blocks replaced, their live rows and
the compaction's commit ts. Exit 0 on success (also when there was nothing to do),
1 when the TN refused (an unknown table), 2 when no TN answered.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from infra.config import KwalConfig
from infra.control import send_command
from infra.exceptions import OpsError


def run(args: Any, cfg: KwalConfig) -> int:
    table = getattr(args, "table", None) or ""
    timeout_s = float(getattr(args, "timeout", 30.0))
    try:
        result = send_command(cfg, "compact", {"table": table}, timeout_s)
    except OpsError as e:
        print(f"kwal ops compact: {e}", file=sys.stderr)
        return 1 if "refused" in str(e) else 2
    done: list[dict[str, Any]] = list(result or [])
    if getattr(args, "json", False):
        print(json.dumps({"compacted": done}))
        return 0
    if not done:
        print("nothing to compact (no table passes the policy's thresholds)")
    for c in done:
        if c.get("error"):
            print(f"{c['table']}: deferred ({c['error']}); the next pass retries")
        else:
            print(
                f"{c['table']}: {len(c['blocks'])} blocks ({c['live_rows']} live rows) "
                f"rewritten at ts {c['commit_ts']}"
            )
    return 0
