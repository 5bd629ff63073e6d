"""Issue 31's acceptance on Apache Kafka with SASL/SCRAM over TLS and Kafka ACLs.

One secure broker and one TN (a `python -m tn.service.main` process on the Kafka WAL, as
principal `kwal-tn`) for the module. Services `alice` and `bob`, CN `cn1`; the TN's
`write_acl` lets alice write `shop.*` and bob `bobs.*`. What each test proves is in its
docstring; together: the broker refuses who is not authenticated and what a principal
was not granted, and the TN takes a request's principal from where the broker put it,
never from the request.
"""

from __future__ import annotations

import dataclasses
import random
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AclBindingFilter

from infra import acls
from infra.brokers.secure import can_log_in
from infra.config import KwalConfig
from infra.processes import free_port
from infra.secure_stack import config_toml
from ops.cli import main as kwal
from producers import Client, CommitResult, PermissionDenied
from schemas.arrow_ipc import ipc_to_table
from schemas.logtail import Changes, Heartbeat, decode_logtail
from schemas.requests import (
    OpKind,
    Reason,
    TxnOp,
    TxnRequest,
    TxnResult,
    decode_result,
    encode_request,
)
from tests.security.secure_stack import ALICE, BOB, CN, TN, SecureStack
from tests.waiting import wait_until
from tn.service.process import TnProcess

SHOP = "shop.t"
MAX_REQUEST = 64 << 10  # the TN's tn.max_request_bytes here: an oversized request stays small


@dataclasses.dataclass
class Running:
    stack: SecureStack
    prefix: str
    tmp: Path
    tn: TnProcess

    def metric(self, line_start: str) -> float:
        """A sample of the TN's metrics endpoint (0 when the line is not there yet)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.tn.cfg.tn.metrics_port}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(line_start):
                    return float(line.rsplit(" ", 1)[1])
        return 0.0

    def cfg(self, user: str) -> KwalConfig:
        cfg = self.stack.config(user, self.prefix, self.tmp)
        cfg.tn.max_request_bytes = MAX_REQUEST
        return cfg


@pytest.fixture(scope="module")
def running(secure_stack: SecureStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("secure")
    prefix = secure_stack.provision(tmp)
    tn_cfg = secure_stack.config(TN, prefix, tmp)
    tn_cfg.tn.max_request_bytes = MAX_REQUEST
    tn_cfg.tn.write_acl = f"{ALICE}=shop.*;{BOB}=bobs.*"
    tn_cfg.tn.heartbeat_ms = 100
    tn_cfg.tn.metrics_port = free_port()
    tn = TnProcess(tn_cfg, tmp)
    tn.start()
    run = Running(secure_stack, prefix, tmp, tn)
    try:
        with Client(run.cfg(ALICE)) as alice:
            alice.begin().create_database("shop").create_table(
                SHOP, [("id", "int64"), ("v", "string")], "id"
            ).commit(timeout=60)
        yield run
    finally:
        if tn.proc is not None:
            tn.terminate()


def _producer(cfg: KwalConfig) -> Producer:
    return Producer(cfg.kafka_client(**{"message.timeout.ms": 10_000, "message.max.bytes": cfg.max_record_bytes}))


def _produce_error(cfg: KwalConfig, topic: str) -> KafkaError | None:
    """Produce one record as `cfg`'s principal; the delivery error (None: delivered)."""
    errors: list[KafkaError | None] = []
    p = _producer(cfg)
    p.produce(topic, value=b"x", on_delivery=lambda err, _msg: errors.append(err))
    p.flush(30)
    assert len(errors) == 1, "no delivery report within 30 s"
    return errors[0]


def _group(cfg: KwalConfig) -> str:
    """A group id the principal of `cfg` may use (a librdkafka consumer looks its group's
    coordinator up even when it only assign()s, and that needs the group's READ ACL)."""
    user = cfg.kafka["sasl.username"]
    return cfg.topics.name(f"cn.{user}") if user == CN else f"kwal-producers-test-{uuid.uuid4().hex[:6]}"


def _end(cfg: KwalConfig, topic: str) -> int:
    """The end offset of `topic` now, as `cfg`'s principal sees it."""
    c = Consumer(cfg.kafka_client(**{"group.id": _group(cfg)}))
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1])
    finally:
        c.close()


def _read(cfg: KwalConfig, topic: str, want: int, timeout_s: float = 60.0, start: int = 0) -> list[Any]:
    """Records of `topic` from `start` as `cfg`'s principal until `want` arrived; a
    consumer error (authorization) is raised as an AssertionError naming it."""
    c = Consumer(cfg.kafka_client(**{"group.id": _group(cfg), "enable.auto.commit": False}))
    c.assign([TopicPartition(topic, 0, start)])
    got: list[Any] = []
    errors: list[KafkaError] = []

    def enough() -> bool:
        for msg in c.consume(100, timeout=0.2):
            if msg.error() is not None:
                errors.append(msg.error())
            else:
                got.append(msg)
        return len(got) >= want or bool(errors)

    try:
        wait_until(f"{want} records on {topic}", enough, timeout_s)
    finally:
        c.close()
    if errors:
        raise AssertionError(f"reading {topic}: {errors[0]}")
    return got


def _authorization_refused(cfg: KwalConfig, topic: str) -> None:
    """Subscribing to `topic` as `cfg`'s principal ends in TopicAuthorization (an assign()ed
    reader would wait on the partition silently)."""
    c = Consumer(cfg.kafka_client(**{"group.id": _group(cfg), "enable.auto.commit": False}))
    c.subscribe([topic])
    errors: list[KafkaError] = []

    def refused() -> bool:
        msg = c.poll(0.2)
        if msg is not None:
            assert msg.error() is not None, f"read a record of {topic}"
            errors.append(msg.error())
        return bool(errors)

    try:
        wait_until(f"a refusal to read {topic}", refused, 30)
    finally:
        c.close()
    assert errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors[0]


def _first_error(conf: dict[str, Any]) -> KafkaError:
    """The first error a producer with these settings reports while connecting."""
    errors: list[KafkaError] = []
    p = Producer({**conf, "log_level": 0, "error_cb": errors.append})
    wait_until("a connection error", lambda: p.poll(0.1) is not None and bool(errors), 30)
    return errors[0]


def _logtail_ids(run: Running, until_ts: int) -> list[int]:
    """The ids inserted into shop.t, as the CN's principal reads them from the table's
    logtail topic up to a heartbeat at or past `until_ts`."""
    cfg = run.cfg(CN)
    topic = cfg.topics.logtail("shop", "t")
    c = Consumer(cfg.kafka_client(**{"group.id": _group(cfg), "enable.auto.commit": False}))
    c.assign([TopicPartition(topic, 0, 0)])
    ids: list[int] = []
    seen = [0]

    def caught_up() -> bool:
        for msg in c.consume(100, timeout=0.2):
            assert msg.error() is None, msg.error()
            rec = decode_logtail(msg.value())
            if isinstance(rec.body, Changes) and rec.body.inserts:
                ids.extend(ipc_to_table(rec.body.inserts).column("id").to_pylist())
            if isinstance(rec.body, Heartbeat) or isinstance(rec.body, Changes):
                seen[0] = max(seen[0], rec.commit_ts)
        return seen[0] >= until_ts

    try:
        wait_until(f"the logtail of shop.t up to ts {until_ts}", caught_up, 60)
    finally:
        c.close()
    return ids


def _results(run: Running, user: str, start: int, want: int) -> list[TxnResult]:
    """`want` results on `user`'s results topic from offset `start`, as `user` reads them."""
    cfg = run.cfg(user)
    return [decode_result(m.value()) for m in _read(cfg, cfg.topics.results_of(user), want, start=start)]


# ---- authentication -------------------------------------------------------------------------


def test_unauthenticated_or_wrong_password_cannot_connect(secure_stack: SecureStack) -> None:
    """No TLS, TLS without SASL: the broker closes the connection; a wrong password, an
    unknown user: SASL authentication fails. The right password gets a Metadata answer."""
    node = secure_stack.node
    assert node.certs is not None
    assert can_log_in(node.client_config(ALICE, secure_stack.passwords[ALICE]))
    for conf in (
        {"bootstrap.servers": node.address},
        {"bootstrap.servers": node.address, "security.protocol": "SSL", "ssl.ca.location": str(node.certs.ca)},
    ):
        err = _first_error(conf)
        assert err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._SSL), err
    for user, password in ((ALICE, "not-the-password"), ("mallory", "whatever")):
        err = _first_error(node.client_config(user, password))
        assert err.code() == KafkaError._AUTHENTICATION, err
        assert "invalid credentials" in err.str(), err


# ---- the broker's ACLs ----------------------------------------------------------------------


def test_cn_cannot_produce_to_wal_or_logtail_nor_read_results(running: Running) -> None:
    """The CN's principal reads the catalog (its grant works), and the broker refuses it
    a produce to the WAL and a logtail topic (TopicAuthorization), and reading a
    service's results."""
    cn = running.cfg(CN)
    assert _read(cn, cn.topics.catalog, want=1)
    for topic in (cn.topics.wal, cn.topics.logtail("shop", "t")):
        err = _produce_error(cn, topic)
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (topic, err)
    _authorization_refused(cn, cn.topics.results_of(ALICE))


def test_service_writes_only_its_own_requests_topic(running: Running) -> None:
    """alice may not write bob's requests topic, nor the TN's own topics (requests,
    results, WAL), nor read bob's results; she may write her own requests topic."""
    alice = running.cfg(ALICE)
    t = alice.topics
    for topic in (t.requests_of(BOB), t.requests, t.results, t.wal, t.results_of(BOB)):
        err = _produce_error(alice, topic)
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (topic, err)
    _authorization_refused(alice, t.results_of(BOB))
    assert _produce_error(alice, t.requests_of(ALICE)) is None  # an undecodable request: answered


def test_acl_check_reports_drift_and_apply_repairs_it(
    secure_stack: SecureStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After `apply` the check is clean; an ACL beyond kwal's table (alice may write the
    WAL) and a missing one (bob's results) are reported by `kwal ops acl check` (exit 1);
    `apply` restores the missing one (the extra one stays reported until removed)."""
    prefix = secure_stack.provision(tmp_path)
    admin_cfg = secure_stack.config("admin", prefix, tmp_path)
    assert acls.check(admin_cfg).clean
    admin = acls.admin_client(admin_cfg)
    extra = acls._binding(("TOPIC", admin_cfg.topics.wal, "LITERAL", f"User:{ALICE}", "WRITE"))
    gone = acls._binding(("TOPIC", admin_cfg.topics.results_of(BOB), "LITERAL", f"User:{BOB}", "READ"))
    for fut in admin.create_acls([extra]).values():
        fut.result(timeout=15)
    gone_filter = AclBindingFilter(
        gone.restype, gone.name, gone.resource_pattern_type, gone.principal, gone.host,
        gone.operation, gone.permission_type,
    )
    for fut in admin.delete_acls([gone_filter]).values():
        fut.result(timeout=15)
    drift = acls.check(admin_cfg)
    assert [acls.describe_grant(g) for g in drift.missing] == [
        f"ALLOW User:{BOB} READ on topic {admin_cfg.topics.results_of(BOB)} (literal)"
    ]
    assert len(drift.extra) == 1 and f"User:{ALICE} WRITE on topic {admin_cfg.topics.wal}" in drift.extra[0]
    env_args = _cli_args(admin_cfg, tmp_path)
    assert kwal([*env_args, "ops", "acl", "check"]) == 1
    out = capsys.readouterr().out
    assert "missing: ALLOW User:bob READ" in out and "extra: ALLOW User:alice WRITE" in out
    assert kwal([*env_args, "ops", "acl", "apply"]) == 1  # created the missing one; extra remains
    assert acls.check(admin_cfg).missing == []


def _cli_args(cfg: KwalConfig, tmp: Path) -> list[str]:
    """`kwal --config FILE` for `cfg`'s Kafka settings and security section."""
    path = tmp / "kwal.toml"
    path.write_text(config_toml(cfg))
    return ["--config", str(path)]


# ---- principals at the TN -------------------------------------------------------------------


def test_forged_client_id_is_refused_and_own_writes_commit(running: Running) -> None:
    """alice's writes commit; alice naming client bob in her request is refused by the TN
    (PermissionDenied, forged_client) and nothing of it reaches the table."""
    with Client(running.cfg(ALICE)) as alice, Client(running.cfg(ALICE), client_id=BOB) as forger:
        alice.begin().insert(SHOP, [{"id": 1, "v": "alice"}]).commit(timeout=60)
        with pytest.raises(PermissionDenied) as info:
            forger.begin().insert(SHOP, [{"id": 2, "v": "forged"}]).commit(timeout=60)
        assert info.value.code == Reason.FORGED_CLIENT
        last = alice.begin().insert(SHOP, [{"id": 3, "v": "alice"}]).commit(timeout=60)
    ids = _logtail_ids(running, last.commit_ts)
    assert 2 not in ids and {1, 3} <= set(ids)


def test_write_acl_is_evaluated_against_the_principal(running: Running) -> None:
    """bob (write_acl: bobs.*) may not write shop.t, whatever his request says; his own
    database commits."""
    with Client(running.cfg(BOB)) as bob:
        with pytest.raises(PermissionDenied, match="bob"):
            bob.begin().insert(SHOP, [{"id": 20, "v": "bob"}]).commit(timeout=60)
        bob.begin().create_database("bobs").commit(timeout=60)


def test_request_replayed_by_another_principal_is_refused(running: Running) -> None:
    """bob copies alice's request, bytes for bytes, into his topic: refused
    (forged_client), answered to bob only; bob re-sending it under his own name is judged
    as bob's (write_acl refuses) and does not collide with alice's id; alice's own send of
    that id then commits: a replay neither runs nor poisons her id."""
    rid = uuid.uuid4().hex
    rows = pa.table({"id": pa.array([30], pa.int64()), "v": ["alice"]})
    original = encode_request(TxnRequest(rid, ALICE, (TxnOp(OpKind.INSERT, "shop", "t", rows=rows),)))
    bob = running.cfg(BOB)
    before = _end(bob, bob.topics.results_of(BOB))
    as_bob = encode_request(TxnRequest(rid, BOB, (TxnOp(OpKind.INSERT, "shop", "t", rows=rows),)))
    p = _producer(bob)
    for value in (original, as_bob):
        p.produce(bob.topics.requests_of(BOB), key=BOB.encode(), value=value)
    assert p.flush(30) == 0
    replayed, renamed = _results(running, BOB, before, 2)
    assert (replayed.request_id, replayed.committed, replayed.reason) == (rid, False, Reason.FORGED_CLIENT)
    assert (renamed.request_id, renamed.committed, renamed.reason) == (rid, False, "permission_denied")
    with Client(running.cfg(ALICE)) as alice:
        txn = alice.begin().insert(SHOP, rows)
        done = txn.commit(timeout=60, request_id=rid)
    assert done.request_id == rid
    assert _logtail_ids(running, done.commit_ts).count(30) == 1


def _hostile(rng: random.Random, valid: bytes) -> bytes:
    kind = rng.randrange(5)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 200))  # not a kwal record
    if kind == 1:
        return valid[: rng.randrange(5, len(valid))]  # truncated
    if kind == 2:
        return valid[:2] + bytes([99]) + valid[3:]  # a schema version nobody knows
    if kind == 3:
        return valid + b"\0" * MAX_REQUEST  # oversized (still within the topic's limit)
    forged = TxnRequest(uuid.uuid4().hex, ALICE, (TxnOp(OpKind.INSERT, "shop", "t", rows=pa.table(
        {"id": pa.array([rng.randrange(10**6, 2 * 10**6)], pa.int64()), "v": ["forged"]})),))
    return encode_request(forged)  # names alice, sent by bob


def test_hostile_stream_keeps_the_tn_committing(running: Running) -> None:
    """bob sends 60 hostile records (random bytes, truncated, an unknown version,
    oversized, naming alice) while alice commits 30 inserts: each of alice's commits, each
    hostile record gets an aborted result with a reason on bob's results topic, the TN
    process stays up, and no hostile row reaches the table."""
    rng = random.Random(31)
    bob = running.cfg(BOB)
    before = _end(bob, bob.topics.results_of(BOB))
    valid = encode_request(TxnRequest("x", BOB, (TxnOp(OpKind.INSERT, "bobs", "t", rows=pa.table({"id": [1]})),)))
    hostile = [_hostile(rng, valid) for _ in range(60)]
    p = _producer(bob)
    with Client(running.cfg(ALICE)) as alice:
        futures: list[Future[CommitResult]] = []
        for i, value in enumerate(hostile):
            p.produce(bob.topics.requests_of(BOB), key=BOB.encode(), value=value)
            p.poll(0)
            if i % 2 == 0:
                futures.append(alice.begin().insert(SHOP, [{"id": 1000 + i, "v": "ok"}]).commit_async())
        assert p.flush(30) == 0
        done = [f.result(timeout=60) for f in futures]
    assert len(done) == 30
    answers = _results(running, BOB, before, len(hostile))
    assert len(answers) == len(hostile)
    assert all(not r.committed and r.reason for r in answers), [r for r in answers if r.committed or not r.reason]
    reasons = {r.reason for r in answers}
    assert {Reason.UNDECODABLE, Reason.UNSUPPORTED_VERSION, Reason.TOO_LARGE, Reason.FORGED_CLIENT} <= reasons
    assert running.tn.proc is not None and running.tn.proc.poll() is None
    ids = _logtail_ids(running, max(d.commit_ts for d in done))
    assert {1000 + i for i in range(0, 60, 2)} <= set(ids)
    assert not [i for i in ids if i >= 10**6]


def test_request_without_a_principal_is_dropped_and_counted(running: Running) -> None:
    """A record on the TN's own requests topic without the gateway's principal header
    (only the TN's principal may write there; here it does, as a broken gateway would):
    nobody can be answered, so it is dropped and counted, and the TN goes on committing."""
    tn = running.cfg(TN)
    p = _producer(tn)
    p.produce(tn.topics.requests, key=b"x", value=b"no principal header")
    assert p.flush(30) == 0
    wait_until(
        "kwal_security_dropped_total{what=request_without_principal} at 1",
        lambda: running.metric('kwal_security_dropped_total{what="request_without_principal"}') == 1.0,
        60,
    )
    with Client(running.cfg(ALICE)) as alice:
        alice.begin().insert(SHOP, [{"id": 5000, "v": "after"}]).commit(timeout=60)
