"""Fault: S3 unavailable during a checkpoint. The checkpoint fails cleanly (no manifest,
no truncation, the TN keeps committing) and the next attempt, with S3 back, succeeds;
a restart then recovers everything from checkpoint + WAL."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.config import ObjectStoreConfig
from infra.objectstore import ObjectStoreError, S3Store
from infra.processes import ServerProcess
from infra.s3server import ACCESS_KEY, SECRET_KEY
from tests.checkpoint.helpers import create, insert, open_log, restart, shutdown
from tests.conftest import unique
from tests.faults.tcp_proxy import TcpProxy
from tn.checkpoint.manifest import list_manifests
from tn.checkpoint.recovery import recover


def test_checkpoint_during_s3_outage_fails_cleanly_and_is_retried(
    s3_server: ServerProcess, tmp_path: Path
) -> None:
    proxy = TcpProxy(s3_server.address)
    store = S3Store(unique("bucket-"), "kwal", ObjectStoreConfig(
        endpoint_url=f"http://{proxy.address}", access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY))
    store.ensure_bucket()
    wal = tmp_path / "wal"
    rec = recover(open_log(wal), store)
    engine = rec.engine
    runner = rec.runner()
    try:
        create(engine)
        insert(engine, 0, 100)
        first = runner.checkpoint()
        assert first is not None
        truncated = engine.log.truncated()
        insert(engine, 100, 200)

        proxy.cut()
        with pytest.raises(ObjectStoreError):
            runner.checkpoint()
        assert engine.log.truncated() == truncated  # nothing truncated without a manifest
        insert(engine, 200, 300)  # the TN keeps committing while S3 is away

        proxy.restore()
        assert [m.ts for m in list_manifests(store)] == [first.ts]  # the failed one left none
        second = runner.checkpoint()
        assert second is not None and second.ts > first.ts
        assert engine.log.truncated() > truncated
        expected = engine.read("db", "t").to_pylist()
    finally:
        shutdown(engine)
    again = restart(wal, store)
    try:
        assert again.engine.read("db", "t").to_pylist() == expected
        assert len(expected) == 300
    finally:
        shutdown(again.engine)
        proxy.close()
