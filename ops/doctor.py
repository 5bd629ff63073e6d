"""`kwal doctor`: print the broker's probed features (`infra.capabilities`) as a table or JSON."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Any

from infra.capabilities import BrokerUnreachableError, probe, split_brain_safety
from infra.config import KwalConfig


def run(args: Any, cfg: KwalConfig) -> int:
    try:
        features = probe(cfg, timeout_s=float(getattr(args, "timeout", 10.0)), refresh=True)
    except BrokerUnreachableError as e:
        print(f"kwal doctor: {e}", file=sys.stderr)
        return 1
    if getattr(args, "json", False):
        print(json.dumps(asdict(features), sort_keys=True))
        return 0
    print(f"Kafka at {features.bootstrap}")
    print(f"{'feature':<22} {'status':<8} detail")
    for name, result in features.items():
        print(f"{name:<22} {result.status:<8} {result.detail}")
    print(f"split-brain safety: {split_brain_safety(features)}")
    return 0
