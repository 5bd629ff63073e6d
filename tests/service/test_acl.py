"""Table-level write permissions in the TN config."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from infra.config import KwalConfig
from producers import Client, PermissionDenied
from schemas.requests import OpKind, TxnOp, TxnRequest
from tests.service.conftest import RunningTn
from tn.service.acl import AclError, WriteAcl


def _req(client: str, *targets: tuple[str, str]) -> TxnRequest:
    return TxnRequest("r", client, tuple(TxnOp(OpKind.DELETE, db, t, keys=None) for db, t in targets))


def test_acl_rules() -> None:
    acl = WriteAcl("billing=shop.orders|shop.refunds; ops=shop.*; *=scratch.*")
    assert acl.denied(_req("billing", ("shop", "orders"))) is None
    assert "may not write shop.stock" in (acl.denied(_req("billing", ("shop", "stock"))) or "")
    assert acl.denied(_req("ops", ("shop", "stock"))) is None
    assert acl.denied(_req("anyone", ("scratch", "x"))) is None
    assert acl.denied(_req("anyone", ("shop", "orders"))) is not None
    assert "own database" in (WriteAcl("").denied(_req("x", ("kwal_system", "requests"))) or "")
    with pytest.raises(AclError, match="client=db.table"):
        WriteAcl("nonsense")


def test_tn_refuses_writes_outside_the_acl(
    kwal_config: KwalConfig, client_factory: Callable[..., Client]
) -> None:
    from infra.topics import ensure_topics
    from tests.service.conftest import make_engine

    kwal_config.tn.write_acl = "admin=shop.*;writer=shop.allowed"
    ensure_topics(kwal_config)
    engine = make_engine()
    tn = RunningTn(kwal_config, engine)
    try:
        admin = client_factory(client_id="admin")
        t = admin.begin().create_database("shop")
        t.create_table("shop.allowed", [("id", "int64")], "id")
        t.create_table("shop.secret", [("id", "int64")], "id")
        t.commit(timeout=30)
        writer = client_factory(client_id="writer")
        writer.begin().insert("shop.allowed", [{"id": 1}]).commit(timeout=30)
        with pytest.raises(PermissionDenied, match="may not write shop.secret"):
            writer.begin().insert("shop.secret", [{"id": 1}]).commit(timeout=30)
        with pytest.raises(PermissionDenied):
            writer.begin().insert("kwal_system.requests", [{"request_id": "x", "req_offset": 0}]).commit(timeout=30)
        assert engine.read("shop", "secret").num_rows == 0
        assert engine.read("shop", "allowed").num_rows == 1
    finally:
        tn.service.stop(drain_timeout_s=5)
        engine.close()
