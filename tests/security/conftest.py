"""Fixtures of the security tests: one secure Apache Kafka per test module (SASL_SSL with
SCRAM-SHA-512, the StandardAuthorizer, no ACL = no access), started here; see
tests/security/secure_stack.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import _log_dir
from tests.security.secure_stack import SecureStack


@pytest.fixture(scope="module")
def secure_stack() -> Iterator[SecureStack]:
    stack = SecureStack.start(_log_dir())
    try:
        yield stack
    finally:
        stack.stop()
