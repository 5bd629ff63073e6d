"""`kwal up --secure`: the local stack's broker as a secure Apache Kafka (docs/security.md).

1. start a `SecureKafkaNode` (SASL_SSL with SCRAM-SHA-512, its own CA, the
   StandardAuthorizer, no ACL = no access) with a fresh admin password;
2. create a SCRAM user with a random password for the TN, each service and each CN
   (`[security]`; none named: one service `app` and one CN `cn`);
3. apply kwal's ACLs (`infra.acls`) as the admin, which also creates each service's topics;
4. write one config file per principal, `<state_dir>/secure/<principal>.toml` (mode 0600:
   it holds the password), to run that role with: `KWAL_CONFIG=... kwal tn run`.
"""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path

from infra import acls
from infra.brokers.secure import ADMIN_USER, SecureKafkaNode, create_scram_users
from infra.config import KwalConfig
from infra.processes import ServerProcess

DEFAULT_SERVICE, DEFAULT_CN = "app", "cn"


def secure_config(cfg: KwalConfig, node: SecureKafkaNode, user: str, password: str) -> KwalConfig:
    """`cfg` as principal `user` of `node`, in secure mode."""
    out = dataclasses.replace(
        cfg,
        kafka=node.client_config(user, password),
        security=dataclasses.replace(cfg.security, enabled=True),
        bootstrap_explicit=True,
    )
    if not out.security.services:
        out.security.services = DEFAULT_SERVICE
    if not out.security.cns:
        out.security.cns = DEFAULT_CN
    return out


def config_toml(cfg: KwalConfig) -> str:
    """The settings a principal's role needs, as a kwal TOML file."""
    kafka = "".join(f'"{k}" = "{v}"\n' for k, v in cfg.kafka.items())
    s = cfg.security
    return (
        f"[kafka]\n{kafka}\n[topics]\nprefix = \"{cfg.topics.prefix}\"\n\n"
        f"[security]\nenabled = true\ntn_principal = \"{s.tn_principal}\"\n"
        f"services = \"{s.services}\"\ncns = \"{s.cns}\"\n"
    )


def start_secure(cfg: KwalConfig, kafka_dir: Path, timeout_s: float) -> tuple[ServerProcess, Path]:
    """Steps 1-4; returns the broker process and the folder of the config files."""
    node = SecureKafkaNode(kafka_dir, timeout_s=timeout_s, admin_password=secrets.token_urlsafe(16))
    process = node.start()
    try:
        admin = secure_config(cfg, node, ADMIN_USER, node.admin_password)
        s = admin.security
        users = [s.tn_principal, *s.service_list(), *s.cn_list()]
        passwords = {u: secrets.token_urlsafe(16) for u in users}
        create_scram_users(node.admin_config, passwords)
        acls.apply(admin)
        out = Path(cfg.stack.state_dir) / "secure"
        out.mkdir(parents=True, exist_ok=True)
        for user, password in [(ADMIN_USER, node.admin_password), *passwords.items()]:
            path = out / f"{user}.toml"
            path.touch(mode=0o600)
            path.write_text(config_toml(secure_config(cfg, node, user, password)))
    except BaseException:
        process.stop()
        raise
    return process, out
