"""Safe retries (issue 30, item 4): `commit(request_id=...)` never yields a double commit.

The TN (a real `tn.service.main` process on the Kafka WAL) runs a request id once and
answers every later copy with the first outcome: after the sending service was killed,
and across TN restarts (replay of the WAL, then a checkpoint that truncated it). Each
test also shows that the same transaction under a *fresh* id does run again (and is
refused as a duplicate key), so a second execution of the retried id could not have
gone unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from infra.config import KwalConfig
from infra.processes import REPO, child_env
from infra.topics import ensure_topics
from producers import Client, ValidationError, new_request_id
from tests.service.harness import recover_engine
from tn.catalog.nodes import SYSTEM_DB
from tn.checkpoint.commands import run_now
from tn.service.process import TnProcess
from tn.service.system_tables import REQUESTS_TABLE

TABLE = "retry.t"


@pytest.fixture
def tn(kwal_config: KwalConfig, tmp_path: Path) -> Iterator[TnProcess]:
    kwal_config.wal.backend = "kafka"  # the default; named, as the test is about its replay
    kwal_config.tn.heartbeat_ms = 200
    ensure_topics(kwal_config)
    proc = TnProcess(kwal_config, tmp_path)
    proc.start()
    try:
        with Client(kwal_config, "setup") as client:
            t = client.begin()
            t.create_database("retry")
            t.create_table(TABLE, [("id", "int64"), ("v", "string")], "id")
            t.commit(timeout=60)
        yield proc
    finally:
        proc.kill()


def insert(client: Client, key: int, request_id: str | None = None) -> int:
    t = client.begin()
    t.insert(TABLE, [{"id": key, "v": "once"}])
    return t.commit(timeout=60, request_id=request_id).commit_ts


def delete(client: Client, key: int) -> int:
    t = client.begin()
    t.delete(TABLE, [key])
    return t.commit(timeout=60).commit_ts


def state_after_stop(cfg: KwalConfig, tn: TnProcess) -> tuple[dict[int, str], set[str]]:
    """The TN's rows and its dedup table's ids, recovered in this process once the TN
    stopped cleanly."""
    assert tn.terminate() == 0
    engine, log = recover_engine(cfg)
    try:
        rows = {r["id"]: r["v"] for r in engine.read("retry", "t").to_pylist()}
        ids = set(engine.read(SYSTEM_DB, REQUESTS_TABLE).column("request_id").to_pylist())
        return rows, ids
    finally:
        engine.close()
        log.close()


def test_a_service_killed_after_sending_retries_without_a_double_commit(
    kwal_config: KwalConfig, tn: TnProcess
) -> None:
    rid = new_request_id()
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.producers.send_child", rid, "1"],
        cwd=REPO,
        env=child_env(kwal_config),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"sent\n"  # blocks until the child says so
    finally:
        child.kill()  # SIGKILL: it never reads its result
        child.wait(30)
    with Client(kwal_config, "restarted-service") as client:
        first = insert(client, 1, rid)  # the restarted service's retry
        assert insert(client, 1, rid) == first  # and another: the same answer
        # the async form, two copies in flight at once: both get the first outcome
        futures = []
        for _ in range(2):
            t = client.begin()
            t.insert(TABLE, [{"id": 1, "v": "once"}])
            futures.append(t.commit_async(request_id=rid))
        assert [f.result(timeout=60).commit_ts for f in futures] == [first, first]
        with pytest.raises(ValidationError) as fresh:  # what running it again would give
            insert(client, 1)
        assert fresh.value.code == "duplicate_key"
    rows, ids = state_after_stop(kwal_config, tn)
    assert rows == {1: "once"} and rid in ids


def test_a_tn_restart_between_two_sends_answers_the_first_outcome(
    kwal_config: KwalConfig, tn: TnProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    committed, refused = new_request_id(), new_request_id()
    with Client(kwal_config, "service") as client:
        first_ts = insert(client, 1, committed)
        with pytest.raises(ValidationError) as first_abort:
            insert(client, 1, refused)  # key 1 exists: this id's first outcome is an abort
        assert first_abort.value.code == "duplicate_key"
        delete(client, 1)  # a second run of either id would now insert key 1 again

        # 1. a crash and a restart: the dedup table is replayed from the WAL
        tn.kill()
        tn.start()
        assert insert(client, 1, committed) == first_ts
        with pytest.raises(ValidationError) as again:
            insert(client, 1, refused)
        assert again.value.code == "duplicate_key"

        # 2. a crash, a checkpoint (which truncates the WAL), a restart: the dedup table
        # now comes from the checkpoint
        tn.kill()
        assert run_now(SimpleNamespace(json=True), kwal_config) == 0
        checkpoint = json.loads(capsys.readouterr().out)
        assert checkpoint["truncated_lsn"] > 0  # the entries of both sends are behind it
        tn.start()
        assert insert(client, 1, committed) == first_ts
        with pytest.raises(ValidationError) as again:
            insert(client, 1, refused)
        assert again.value.code == "duplicate_key"
    rows, ids = state_after_stop(kwal_config, tn)
    assert rows == {}
    assert committed in ids and refused not in ids  # an abort is known from the results topic


def test_a_bad_request_id_is_refused_before_anything_is_sent(kwal_config: KwalConfig) -> None:
    ensure_topics(kwal_config)
    with Client(kwal_config, "service") as client:
        for bad, what in (("", "non-empty"), ("x" * 257, "at most 256"), ("@0:1", "'@'")):
            t = client.begin()
            t.insert(TABLE, [{"id": 1, "v": "x"}])
            with pytest.raises(ValidationError, match=what) as err:
                t.commit(timeout=5, request_id=bad)
            assert err.value.code == "bad_request_id"
            assert t.commit_async(request_id=uuid.uuid4().hex) is not None  # still unsent


def test_a_fresh_request_id_is_a_random_uuid4_in_hex() -> None:
    ids = {new_request_id() for _ in range(2000)}
    assert len(ids) == 2000
    for rid in ids:
        u = uuid.UUID(hex=rid)
        assert (u.hex, u.version, u.variant) == (rid, 4, uuid.RFC_4122)
