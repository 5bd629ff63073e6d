"""`kwal changes run`: the change stream follower as a process (consumers.cdc.follower)."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from infra.collector import freeze_startup_heap
from infra.config import KwalConfig
from infra.objectstore import open_store


def run(args: Any, cfg: KwalConfig) -> int:
    """Follow the logtail and publish the change stream until SIGTERM/SIGINT (or `--seconds`)."""
    from consumers.cdc.follower import ChangeStreamError, ChangeStreamPublisher

    if getattr(args, "table", None):
        cfg.change_stream.tables = ",".join(args.table)
    if not cfg.change_stream.active:
        print("kwal changes run: no table has a change stream (set change_stream.enabled, "
              "change_stream.tables or --table db.t)", file=sys.stderr)
        return 2
    try:
        stream = ChangeStreamPublisher(cfg, cfg.change_stream.registry_url, open_store(cfg.objectstore))
    except ChangeStreamError as e:
        print(f"kwal changes run: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    freeze_startup_heap()  # a long-running process: full collections skip its imports
    stream.start()
    print(f"kwal changes: publishing to {cfg.topics.name('changes')}.* "
          f"(registry {cfg.change_stream.registry_url})", flush=True)
    try:
        stop.wait(args.seconds or None)
    finally:
        stream.close()
    errors = stream.errors + stream.follower.errors
    for error in errors:
        print(f"kwal changes: {error}", file=sys.stderr)
    return 1 if errors else 0
