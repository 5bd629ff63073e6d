"""The schema registry of the change stream tests: Apicurio Registry (infra.registry), one
per test session, on loopback; each test's subjects are named by its own topic prefix."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from infra.registry.apicurio import ccompat_url, start_registry
from tests.conftest import server_dir


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[str]:
    """The Confluent-compatible API's URL of a registry this session started."""
    server = start_registry(server_dir("registry-"))
    try:
        yield ccompat_url(server.address)
    finally:
        server.stop()
