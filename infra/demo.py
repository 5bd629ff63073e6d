"""`kwal demo`: the end-to-end demo on the embedded stack (the README's main job).

1. start the embedded stack (loopback S3 + broker) unless one is configured;
2. probe the broker's features (`kwal doctor`);
3. provision kwal's topics;
4. run the demo workload (grows with each issue: TN, producers, CNs);
5. print a short report and stop everything it started.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from infra.config import KwalConfig
from infra.doctor import probe
from infra.stack import start_stack, stop_stack
from infra.topics import ensure_topics


def run(args: Any, cfg: KwalConfig) -> int:
    started = time.monotonic()
    own_stack = None
    if not cfg.bootstrap_explicit and not getattr(args, "bootstrap", None):
        cfg.stack.state_dir = tempfile.mkdtemp(prefix="kwal-demo-")
        print(f"[demo] starting the embedded stack in {cfg.stack.state_dir}")
        own_stack = start_stack(cfg)
        cfg = cfg.with_bootstrap(own_stack.broker_address)
        cfg.objectstore = own_stack.object_store
    try:
        print(f"[demo] Kafka at {cfg.bootstrap}; probing features")
        features = probe(cfg)
        for name, result in features.items():
            print(f"[demo]   {name:<22} {result.status}")
        ensure_topics(cfg)
        print(f"[demo] topics ready under prefix {cfg.topics.prefix!r}")
        report = {"kafka": cfg.bootstrap, "seconds": round(time.monotonic() - started, 1)}
        print(f"[demo] report: {report}")
        return 0
    except Exception as e:  # noqa: BLE001 - the demo reports any failure in one line
        print(f"[demo] failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if own_stack is not None:
            stopped = stop_stack(own_stack)
            print(f"[demo] stopped {', '.join(stopped)}; logs in {Path(own_stack.log_dir)}")
