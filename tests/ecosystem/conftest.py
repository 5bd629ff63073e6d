"""The schema registry of the change stream tests: Apicurio Registry (infra.registry), one
per test session, on loopback; each test's subjects are named by its own topic prefix."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.registry.apicurio import ccompat_url, start_registry
from tests.conftest import LOG_DIR


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[str]:
    """The Confluent-compatible API's URL of a registry this session started."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    server = start_registry(Path(tempfile.mkdtemp(prefix="registry-", dir=LOG_DIR)))
    try:
        yield ccompat_url(server.address)
    finally:
        server.stop()
