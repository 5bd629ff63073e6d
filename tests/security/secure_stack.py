"""The secure test stack: one SASL_SSL Apache Kafka node per test module, its SCRAM users,
kwal's ACLs, and configs per principal (docs/security.md)."""

from __future__ import annotations

import dataclasses
import secrets
import tempfile
import uuid
from pathlib import Path

from infra import acls
from infra.brokers.secure import SecureKafkaNode, create_scram_users
from infra.config import KwalConfig

TN, ALICE, BOB, CN = "kwal-tn", "alice", "bob", "cn1"
USERS = (TN, ALICE, BOB, CN)


@dataclasses.dataclass
class SecureStack:
    node: SecureKafkaNode
    passwords: dict[str, str]

    @classmethod
    def start(cls, log_dir: Path) -> SecureStack:
        node = SecureKafkaNode(Path(tempfile.mkdtemp(prefix="broker-secure-", dir=log_dir)))
        node.start()
        passwords = {u: secrets.token_hex(12) for u in USERS}
        try:
            create_scram_users(node.admin_config, passwords)
        except Exception:
            node.stop()
            raise
        return cls(node, passwords)

    def stop(self) -> None:
        self.node.stop()

    def config(self, user: str, prefix: str, tmp: Path) -> KwalConfig:
        """A config for `user` (the admin's when user is "admin") on this broker, secure mode,
        with the test's topic prefix."""
        cfg = KwalConfig.load(environ={})
        password = self.node.admin_password if user == "admin" else self.passwords[user]
        cfg = dataclasses.replace(cfg, kafka=self.node.client_config(user, password), bootstrap_explicit=True)
        cfg.topics.prefix = prefix
        cfg.security.enabled = True
        cfg.security.tn_principal = TN
        cfg.security.services = f"{ALICE},{BOB}"
        cfg.security.cns = CN
        cfg.wal.dir = str(tmp / "wal")
        cfg.stack.state_dir = str(tmp / "state")
        cfg.objectstore.url = f"file://{tmp / 'objects'}"
        return cfg

    def provision(self, tmp: Path) -> str:
        """A fresh topic prefix with kwal's ACLs applied (as the admin); returns the prefix."""
        prefix = f"kwal-{uuid.uuid4().hex[:10]}"
        acls.apply(self.config("admin", prefix, tmp))
        return prefix
