"""`kwal ops acl apply|check`: kwal's Kafka ACLs (infra.acls), with an admin's credentials.

`apply` creates each service's topics and every missing ACL, and prints what it created;
`check` prints what is missing and what is there beyond kwal's table, and exits 1 when
either list is not empty (drift).
"""

from __future__ import annotations

from typing import Any

from infra.acls import AclApplyError, apply, check, describe_grant
from infra.config import KwalConfig
from infra.topics import TopicError


def run(args: Any, cfg: KwalConfig) -> int:
    try:
        if args.action == "apply":
            created = apply(cfg, timeout_s=args.timeout)
            for g in created:
                print(f"created: {describe_grant(g)}")
            print(f"kwal ACLs applied ({len(created)} created)")
        drift = check(cfg, timeout_s=args.timeout)
    except (AclApplyError, TopicError) as e:
        print(f"kwal ops acl: {e}")
        return 2
    for g in drift.missing:
        print(f"missing: {describe_grant(g)}")
    for b in drift.extra:
        print(f"extra: {b}")
    if args.action == "check":
        print("no drift" if drift.clean else "drift from kwal's ACLs")
    return 0 if drift.clean else 1
