"""Principals in secure mode: who sent a request, as the broker authenticated it.

In secure mode (`[security] enabled`, docs/security.md) a service's principal is its
SASL user name. It writes requests to `<prefix>.requests.<principal>` and reads results
from `<prefix>.results.<principal>`: Kafka ACLs (`infra.acls`) let only that principal
write the one and read the other, so the topic a request arrives on *is* the
authenticated principal. The TN's gateway (`tn.service.gateway`) copies each request
into the TN's own requests topic with the principal in a header (only the TN may write
that topic), and the TN scopes request ids by principal (`scoped_id`): one principal's
ids can neither reach nor replay another's.
"""

from __future__ import annotations

import re

from infra.config import ConfigError, KwalConfig

PRINCIPAL_HEADER = "kwal-principal"  # on the TN's requests topic: who sent the record
MAX_PRINCIPAL_CHARS = 100
_VALID = re.compile(r"[A-Za-z0-9_-]+")


class PrincipalError(ConfigError):
    """A principal name kwal cannot build topic names from, or none configured."""


def check_principal(name: str) -> str:
    """`name` if it can be a principal: letters, digits, '_' and '-' (a topic-name part
    without '.', so `<prefix>.requests.<principal>` names one principal only), at most
    MAX_PRINCIPAL_CHARS."""
    if not _VALID.fullmatch(name) or len(name) > MAX_PRINCIPAL_CHARS:
        raise PrincipalError(
            f"principal {name!r}: use letters, digits, '_' and '-' only, at most "
            f"{MAX_PRINCIPAL_CHARS} characters (it is part of topic names)"
        )
    return name


def client_principal(cfg: KwalConfig) -> str:
    """The principal a client of `cfg` authenticates as: its `sasl.username`."""
    user = cfg.kafka.get("sasl.username", "")
    if not user:
        raise PrincipalError(
            "security.enabled needs the client's SASL user: set sasl.username in [kafka] "
            "(KWAL_KAFKA_SASL_USERNAME)"
        )
    return check_principal(user)


def requests_topic(cfg: KwalConfig) -> str:
    """Where a client of `cfg` sends requests."""
    if cfg.security.enabled:
        return cfg.topics.requests_of(client_principal(cfg))
    return cfg.topics.requests


def results_topic(cfg: KwalConfig) -> str:
    """Where a client of `cfg` reads its results."""
    if cfg.security.enabled:
        return cfg.topics.results_of(client_principal(cfg))
    return cfg.topics.results


def requests_pattern(cfg: KwalConfig) -> str:
    """The per-principal requests topics, as a librdkafka subscription regex."""
    return "^" + re.escape(cfg.topics.name("requests.")) + "[A-Za-z0-9_-]+$"


def principal_of_topic(cfg: KwalConfig, topic: str) -> str | None:
    """The principal whose requests topic `topic` is, or None."""
    prefix = cfg.topics.name("requests.")
    if not topic.startswith(prefix):
        return None
    name = topic[len(prefix) :]
    return name if _VALID.fullmatch(name) else None


def scoped_id(principal: str, request_id: str) -> str:
    """A request id as the TN keeps it in secure mode: `<principal>/<id>` ('/' is in no
    principal), so dedup and replay checks never cross principals."""
    return f"{principal}/{request_id}"


def unscoped_id(principal: str, request_id: str) -> str:
    """The id the client sent, back from `scoped_id` (other ids unchanged)."""
    head = f"{principal}/"
    return request_id[len(head) :] if request_id.startswith(head) else request_id
