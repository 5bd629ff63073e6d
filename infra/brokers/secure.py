"""A secure Apache Kafka node: SASL/SCRAM-SHA-512 over TLS, Kafka ACLs, no anonymous clients.

What `SecureKafkaNode` adds to a plain `KafkaNode` (docs/security.md):

- one client listener, `SASL_SSL` on 127.0.0.1: TLS with a certificate the node's own
  CA signed (`make_certs`: PEM files, which Kafka 4.x reads as keystore and truststore
  directly), then SCRAM-SHA-512. A client without TLS, without SASL or with a wrong
  password never gets a request through. The broker talks to itself on the same
  listener, as the `admin` super user;
- the controller listener stays PLAINTEXT on loopback: SCRAM cannot authenticate a
  controller listener (SCRAM credentials live in the metadata log that listener
  serves), and a single node's broker reaches its own controller there. Its principal is
  `User:ANONYMOUS`, which must be a super user for the broker's registration; the
  controller listener serves only controller requests. A production cluster puts
  mutual TLS on it instead (docs/security.md);
- KRaft's `StandardAuthorizer` with `allow.everyone.if.no.acl.found=false`: a principal
  may do only what an ACL grants (`infra.acls` writes kwal's);
- SCRAM users: `admin` is created when the storage is formatted (StorageTool
  `--add-scram`), before the broker starts; the others by `create_scram_users` through
  the Admin API (AlterUserScramCredentials), at any time.

Start (`SecureKafkaNode.start`): 1. make the CA and the node's certificate (first start);
2. format the storage with the admin user (first start); 3. start `kafka.Kafka` and wait,
bounded, until the admin user's Metadata request names a broker.
"""

from __future__ import annotations

import datetime
import ipaddress
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from infra.brokers.apache_kafka import (
    KAFKA_VERSION,
    KafkaNode,
)

MECHANISM = "SCRAM-SHA-512"
ADMIN_USER = "admin"
SUPER_USERS = f"User:{ADMIN_USER};User:ANONYMOUS"  # ANONYMOUS: the PLAINTEXT controller listener


class SecurityError(RuntimeError):
    """A secure broker could not be set up (certificates, users)."""


@dataclass(frozen=True)
class CertFiles:
    """PEM files: the CA's certificate (clients' `ssl.ca.location`, the broker's truststore)
    and the broker's keystore (its private key, then its certificate)."""

    ca: Path
    keystore: Path


def make_certs(directory: Path, days: int = 30) -> CertFiles:
    """A CA and a broker certificate for 127.0.0.1/localhost signed by it, as PEM files in
    `directory` (kept when they exist: a restarted node keeps its certificate)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    files = CertFiles(directory / "ca.pem", directory / "broker-keystore.pem")
    if files.ca.exists() and files.keystore.exists():
        return files
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kwal local CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kwal-broker")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    files.ca.write_bytes(ca.public_bytes(pem))
    files.keystore.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + cert.public_bytes(pem)
    )
    files.keystore.chmod(0o600)
    return files


def jaas(user: str, password: str) -> str:
    return (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";'
    )


@dataclass
class SecureKafkaNode(KafkaNode):
    """A `KafkaNode` whose only client listener is SASL_SSL (module docstring)."""

    admin_password: str = "admin-secret"
    certs: CertFiles | None = field(default=None, init=False)

    @property
    def cert_dir(self) -> Path:
        return self.directory / "certs"

    def properties(self) -> dict[str, str]:
        props = super().properties()
        assert self.certs is not None, "start() makes the certificates first"
        lsn = "listener.name.sasl_ssl"
        props.update(
            {
                "listeners": f"SASL_SSL://{self.address},CONTROLLER://127.0.0.1:{self.controller_port}",
                "advertised.listeners": f"SASL_SSL://{self.address}",
                "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name": "SASL_SSL",
                "sasl.enabled.mechanisms": MECHANISM,
                "sasl.mechanism.inter.broker.protocol": MECHANISM,
                f"{lsn}.scram-sha-512.sasl.jaas.config": jaas(ADMIN_USER, self.admin_password),
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(self.certs.keystore),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(self.certs.ca),
                "ssl.client.auth": "none",
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "allow.everyone.if.no.acl.found": "false",
                "super.users": SUPER_USERS,
                **self.extra,
            }
        )
        return props

    def client_config(self, user: str, password: str) -> dict[str, str]:
        """librdkafka settings for `user` on this node (the `[kafka]` table of a kwal config)."""
        assert self.certs is not None
        return {
            "bootstrap.servers": self.address,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": MECHANISM,
            "sasl.username": user,
            "sasl.password": password,
            "ssl.ca.location": str(self.certs.ca),
        }

    @property
    def admin_config(self) -> dict[str, str]:
        return self.client_config(ADMIN_USER, self.admin_password)

    def prepare(self) -> None:
        """The certificates the properties name (made once, kept across restarts)."""
        self.certs = make_certs(self.cert_dir.resolve())

    def format_options(self) -> list[str]:
        """The admin user exists from the first start: the node itself logs in with it."""
        return ["--add-scram", f"{MECHANISM}=[name={ADMIN_USER},password={self.admin_password}]"]

    def description(self) -> str:
        return f"secure kafka broker (Apache Kafka {KAFKA_VERSION}, SASL_SSL)"

    def ready(self) -> bool:
        """The admin user's Metadata request names a broker."""
        return can_log_in(self.admin_config, timeout_s=2.0)


def create_scram_users(
    admin_config: dict[str, Any], users: dict[str, str], timeout_s: float = 30.0
) -> None:
    """Create (or reset the password of) SCRAM-SHA-512 users, then wait, bounded, until each
    can log in (the broker applies the credential from its metadata log a moment later)."""
    if not users:
        return
    admin = AdminClient({**admin_config, "log_level": 2})
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    futures = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(u, info, p.encode()) for u, p in users.items()]
    )
    for user, fut in futures.items():
        try:
            fut.result(timeout=timeout_s)
        except KafkaException as e:
            raise SecurityError(f"cannot create SCRAM user {user!r}: {e}") from e
    deadline = time.monotonic() + timeout_s
    for user, password in users.items():
        while not can_log_in({**admin_config, "sasl.username": user, "sasl.password": password}):
            if time.monotonic() > deadline:
                raise SecurityError(f"SCRAM user {user!r} was created but cannot log in")
            time.sleep(0.1)


def can_log_in(client_config: dict[str, Any], timeout_s: float = 5.0) -> bool:
    """True when a client with these settings authenticates (a Metadata request answers)."""
    admin = AdminClient({**client_config, "log_level": 0, "socket.timeout.ms": int(timeout_s * 1000)})
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException:
        return False
    return True


def start_secure_kafka(directory: Path, timeout_s: float = 120.0) -> SecureKafkaNode:
    """A fresh secure node under `directory`, started."""
    node = SecureKafkaNode(directory, timeout_s=timeout_s)
    node.start()
    return node
