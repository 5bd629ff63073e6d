"""Table-level write permissions: which client may write which tables.

`[tn] write_acl` (or `KWAL_TN_WRITE_ACL`) lists, per client id, the tables it
may write (DDL and DML), as `client=db.t1|db.t2;other=db.*`; `*` as client id
covers every client not named. Empty (the default) lets every client write
every table. The TN's own database (`kwal_system`) is never writable by a client.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from schemas.requests import OpKind, TxnRequest
from tn.catalog.nodes import SYSTEM_DB


class AclError(ValueError):
    """The write_acl setting does not parse."""


class WriteAcl:
    def __init__(self, spec: str = "") -> None:
        self.rules: dict[str, list[str]] = {}
        for part in filter(None, (p.strip() for p in spec.split(";"))):
            client, sep, tables = part.partition("=")
            if not sep or not client.strip():
                raise AclError(f"tn.write_acl: {part!r} is not client=db.table|db.*")
            self.rules[client.strip()] = [t.strip() for t in tables.split("|") if t.strip()]

    def denied(self, req: TxnRequest) -> str | None:
        """Why `req` may not run, or None when it may."""
        for op in req.ops:
            if op.database == SYSTEM_DB:
                return f"{SYSTEM_DB} is the TN's own database; clients cannot write it"
            if not self.rules:
                continue
            patterns = self.rules.get(req.client_id, self.rules.get("*"))
            target = f"{op.database}.{op.table}" if op.table else f"{op.database}.*"
            if op.kind in (OpKind.CREATE_DATABASE, OpKind.DROP_DATABASE):
                target = f"{op.database}.*"
            if patterns is None or not any(fnmatchcase(target, p) for p in patterns):
                return f"client {req.client_id!r} may not write {target}"
        return None
