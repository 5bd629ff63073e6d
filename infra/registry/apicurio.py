"""Apicurio Registry on loopback: the schema registry of the change stream (consumers.cdc).

Install: `infra/registry/pom.xml` names Apicurio Registry's application from Maven Central
and builds it with Quarkus's Maven plugin into `~/.cache/kwal/apicurio-registry-<version>/`
once (`infra.maven.build_app`; the pom says why a build and which version). Its storage is
an in-memory H2 database: schemas last as long as the process, as the topics of a test do.

Start (`start_registry`): `java -jar` its runner jar on 127.0.0.1 and a free port, bounded
wait until the Confluent-compatible API lists subjects. Clients (confluent-kafka's
`SchemaRegistryClient`, Kafka Connect's AvroConverter, Flink) take `ccompat_url(address)`.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

from infra.brokers.apache_kafka import java_binary
from infra.maven import MavenError, build_app
from infra.processes import ServerProcess, ServerStartError, free_port, start_server

APICURIO_VERSION = "2.3.1.Final"
POM = Path(__file__).with_name("pom.xml")
HEAP = "-Xms64m -Xmx384m"
CCOMPAT = "/apis/ccompat/v6"
RUNNER = "kwal-schema-registry-1-runner.jar"  # Quarkus's runner jar, its lib/ beside it


class RegistryUnavailableError(ServerStartError):
    """The schema registry cannot be installed or run here (the message says why)."""


def registry_app() -> Path:
    """The built application (the runner jar and its `lib/`), built on first use."""
    try:
        return build_app(POM, f"apicurio-registry-{APICURIO_VERSION}", RUNNER)
    except MavenError as e:
        raise RegistryUnavailableError(f"the schema registry (Apicurio Registry): {e}") from e


def ccompat_url(address: str) -> str:
    """The Confluent-compatible API of a registry listening on `address` (host:port)."""
    return f"http://{address}{CCOMPAT}"


def _answers(address: str) -> bool:
    with urllib.request.urlopen(f"{ccompat_url(address)}/subjects", timeout=2) as reply:
        return bool(reply.status == 200)


def start_registry(directory: Path, port: int | None = None, timeout_s: float = 120.0) -> ServerProcess:
    """Start the registry on 127.0.0.1 (a free port unless given); its log in `directory`."""
    app = registry_app()
    port = port or free_port()
    address = f"127.0.0.1:{port}"
    argv = [
        java_binary(), *HEAP.split(), "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
        "-Djava.awt.headless=true",
        "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={port}",
        "-jar", str(app / RUNNER),
    ]
    directory.mkdir(parents=True, exist_ok=True)
    return start_server(
        f"schema registry (Apicurio Registry {APICURIO_VERSION})",
        argv,
        address,
        directory / "registry.log",
        ready=lambda: _answers(address),
        timeout_s=timeout_s,
    )
