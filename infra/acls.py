"""The Kafka ACLs kwal needs, least privilege per role; apply them, and report drift.

Run with an admin's credentials (`kwal ops acl apply|check`, docs/security.md). The
principals come from `[security]`: `tn_principal`, `services`, `cns`. P is
`topics.prefix`; every grant is ALLOW from any host.

| principal | resource (pattern)                                 | operations        |
|-----------|----------------------------------------------------|-------------------|
| TN        | topics P.requests, P.results, P.wal, P.wal-meta,   | ALL               |
|           | P.catalog, P.ops (literal); P.logtail. (prefixed)  |                   |
|           | topics P.requests. (prefixed): every principal's   | READ, DESCRIBE    |
|           | requests, which the gateway copies                 |                   |
|           | topics P.results. (prefixed): results to principals| WRITE, DESCRIBE   |
|           | groups P.tn, P.ops-reader-, kwal-reader-,          | READ              |
|           | kwal-ops- (prefixed)                               |                   |
|           | transactional id P.tn (literal): the fence         | WRITE, DESCRIBE   |
| service S | topic P.requests.S (literal)                       | WRITE, DESCRIBE   |
|           | topic P.results.S (literal)                        | READ, DESCRIBE    |
|           | group kwal-producers- (prefixed; assign() only,    | READ              |
|           | no offsets are ever committed)                     |                   |
| CN C      | topics P.logtail. (prefixed), P.catalog (literal)  | READ, DESCRIBE    |
|           | groups P.cn.C and P.cn.C.catch-up (literal): its   | READ              |
|           | positions; P.tail (literal, `kwal cn tail`);       |                   |
|           | kwal-spark- (prefixed: the Spark CN's readers)     |                   |

So only the TN writes the WAL, logtail, catalog and results topics; a CN reads the
logtail and catalog topics and its own group only; a service writes its own requests
topic and reads its own results topic only. `apply` also creates each service's two
topics (`infra.topics`). `check` compares the ACLs on kwal's resources (names starting
with P., and the shared group prefixes above) with this table: what is missing, and
what is there but not in the table (drift).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from infra.config import KwalConfig
from infra.principals import check_principal
from infra.topics import admin_client, ensure_topics, principal_topics

# (resource type, name, pattern, principal "User:x", operation): one ALLOW from any host
Grant = tuple[str, str, str, str, str]

TOPIC, GROUP, TXN_ID = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
LITERAL, PREFIXED = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
# group-id prefixes kwal's clients use whatever the topic prefix (assign() readers)
SHARED_GROUP_PREFIXES = ("kwal-reader-", "kwal-ops-", "kwal-producers-", "kwal-spark-")


class AclApplyError(RuntimeError):
    """The broker refused to create an ACL or a topic."""


def _grant(rt: ResourceType, name: str, pt: ResourcePatternType, user: str, op: AclOperation) -> Grant:
    return (rt.name, name, pt.name, f"User:{user}", op.name)


def desired_grants(cfg: KwalConfig) -> set[Grant]:
    """The table of the module docstring for `cfg`'s principals."""
    t, sec = cfg.topics, cfg.security
    tn = check_principal(sec.tn_principal)
    out: set[Grant] = set()
    for topic in (t.requests, t.results, t.wal, t.wal_meta, t.catalog, t.ops):
        out.add(_grant(TOPIC, topic, LITERAL, tn, AclOperation.ALL))
    out.add(_grant(TOPIC, t.name("logtail."), PREFIXED, tn, AclOperation.ALL))
    for op in (AclOperation.READ, AclOperation.DESCRIBE):
        out.add(_grant(TOPIC, t.name("requests."), PREFIXED, tn, op))
    for op in (AclOperation.WRITE, AclOperation.DESCRIBE):
        out.add(_grant(TOPIC, t.name("results."), PREFIXED, tn, op))
    for group in (t.name("tn"), t.name("ops-reader-"), "kwal-reader-", "kwal-ops-"):
        out.add(_grant(GROUP, group, PREFIXED, tn, AclOperation.READ))
    for op in (AclOperation.WRITE, AclOperation.DESCRIBE):  # the fence's transactions
        out.add(_grant(TXN_ID, t.tn_transactional_id, LITERAL, tn, op))
    for service in map(check_principal, sec.service_list()):
        out.add(_grant(TOPIC, t.requests_of(service), LITERAL, service, AclOperation.WRITE))
        out.add(_grant(TOPIC, t.requests_of(service), LITERAL, service, AclOperation.DESCRIBE))
        out.add(_grant(TOPIC, t.results_of(service), LITERAL, service, AclOperation.READ))
        out.add(_grant(TOPIC, t.results_of(service), LITERAL, service, AclOperation.DESCRIBE))
        out.add(_grant(GROUP, "kwal-producers-", PREFIXED, service, AclOperation.READ))
    for cn in map(check_principal, sec.cn_list()):
        for op in (AclOperation.READ, AclOperation.DESCRIBE):
            out.add(_grant(TOPIC, t.name("logtail."), PREFIXED, cn, op))
            out.add(_grant(TOPIC, t.catalog, LITERAL, cn, op))
        for group in (t.name(f"cn.{cn}"), t.name(f"cn.{cn}.catch-up"), t.name("tail")):
            out.add(_grant(GROUP, group, LITERAL, cn, AclOperation.READ))
        out.add(_grant(GROUP, "kwal-spark-", PREFIXED, cn, AclOperation.READ))
    return out


def _binding(g: Grant) -> AclBinding:
    rt, name, pt, principal, op = g
    return AclBinding(
        ResourceType[rt], name, ResourcePatternType[pt], principal, "*",
        AclOperation[op], AclPermissionType.ALLOW,
    )


def _as_grant(b: Any) -> Grant | None:
    """A binding in the table's terms; None for what the table never holds (DENY, a host)."""
    if b.permission_type != AclPermissionType.ALLOW or b.host != "*":
        return None
    return (b.restype.name, b.name, b.resource_pattern_type.name, b.principal, b.operation.name)


def _kwal_resource(cfg: KwalConfig, b: AclBinding) -> bool:
    """Is `b` about one of kwal's resources (so `check` judges it)?"""
    prefix = cfg.topics.name("")
    if b.restype == GROUP and b.name in SHARED_GROUP_PREFIXES:
        return True
    return b.restype in (TOPIC, GROUP, TXN_ID) and b.name.startswith(prefix)


def current_bindings(admin: AdminClient, timeout_s: float) -> list[AclBinding]:
    flt = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None,  # type: ignore[arg-type]
        AclOperation.ANY, AclPermissionType.ANY,
    )
    try:
        return list(admin.describe_acls(flt, request_timeout=timeout_s).result(timeout=timeout_s))
    except KafkaException as e:
        raise AclApplyError(f"cannot list the broker's ACLs: {e}") from e


@dataclass
class Drift:
    missing: list[Grant]  # in the table, not on the broker
    extra: list[str]  # on the broker, on kwal's resources, not in the table

    @property
    def clean(self) -> bool:
        return not self.missing and not self.extra


def check(cfg: KwalConfig, admin: AdminClient | None = None, timeout_s: float = 15.0) -> Drift:
    admin = admin or admin_client(cfg)
    want = desired_grants(cfg)
    ours = {principal for *_, principal, _ in want}
    have: set[Grant] = set()
    extra: list[str] = []
    for b in current_bindings(admin, timeout_s):
        if not _kwal_resource(cfg, b):
            continue
        if b.name in SHARED_GROUP_PREFIXES and b.principal not in ours:
            continue  # another deployment's principal on a shared group prefix: not ours to judge
        g = _as_grant(b)
        if g is not None and g in want:
            have.add(g)
        else:
            extra.append(describe_binding(b))
    return Drift(sorted(want - have), sorted(extra))


def describe_binding(b: Any) -> str:
    return (
        f"{b.permission_type.name} {b.principal} {b.operation.name} on "
        f"{b.restype.name.lower()} {b.name} ({b.resource_pattern_type.name.lower()}, host {b.host})"
    )


def describe_grant(g: Grant) -> str:
    rt, name, pt, principal, op = g
    return f"ALLOW {principal} {op} on {rt.lower()} {name} ({pt.lower()})"


def apply(cfg: KwalConfig, timeout_s: float = 15.0) -> list[Grant]:
    """Create the services' topics and every missing ACL of the table; returns those
    created. Removes nothing: `check` reports what is there beyond the table."""
    ensure_topics(cfg, [spec for s in cfg.security.service_list() for spec in principal_topics(cfg, s)])
    admin = admin_client(cfg)
    missing = check(cfg, admin, timeout_s).missing
    if missing:
        futures = admin.create_acls([_binding(g) for g in missing], request_timeout=timeout_s)
        for binding, fut in futures.items():
            try:
                fut.result(timeout=timeout_s)
            except KafkaException as e:
                raise AclApplyError(f"cannot create ACL {describe_binding(binding)}: {e}") from e
    return missing
