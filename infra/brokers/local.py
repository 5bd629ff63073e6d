"""Which local broker a stack, a benchmark, the demo or the test suite starts.

`kafka` (the default) is Apache Kafka as a KRaft node (`apache_kafka`); `tansu` is
the embedded broker (`tansu`), which needs no JVM but never deletes a record.
"""

from __future__ import annotations

from pathlib import Path

from infra.processes import ServerProcess

BROKERS = ("kafka", "tansu")
DEFAULT_BROKER = "kafka"


class UnknownBrokerError(ValueError):
    """A broker kind other than those in BROKERS was asked for."""


def check_broker(kind: str) -> str:
    if kind not in BROKERS:
        raise UnknownBrokerError(f"unknown broker {kind!r}: choose one of {', '.join(BROKERS)}")
    return kind


def start_local_broker(kind: str, directory: Path, timeout_s: float = 120.0) -> ServerProcess:
    """A fresh broker of `kind` on 127.0.0.1 with a free port, its data and log under
    `directory` (tansu keeps its data in memory)."""
    if check_broker(kind) == "kafka":
        from infra.brokers.apache_kafka import start_kafka

        return start_kafka(directory, timeout_s=timeout_s)
    from infra.brokers.tansu import start_broker

    return start_broker(directory, timeout_s=min(timeout_s, 30.0))
