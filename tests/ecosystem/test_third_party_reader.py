"""Issue 34's acceptance: a reader that imports no kwal module (`third_party_reader.py`,
run as a script; its `sys.modules` is checked) rebuilds tables from their topics using
only `schemas/` and FORMAT.md, and equals the TN at its watermark and at earlier ts:
after inserts, updates, deletes (one of a row inserted by the same transaction), ADD
COLUMN, multi-table transactions, and concurrent commits the TN grouped into shared
transactions. Also: a checkpoint's manifest and catalog snapshot match the JSON schemas
published beside the Avro ones."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import jsonschema

from infra.config import KwalConfig
from infra.objectstore import FolderStore
from infra.topics import ensure_topics
from producers import Client
from tn.checkpoint.runner import CheckpointRunner
from tn.engine import Engine
from tn.logstore.driver import LogStore
from tn.logstore.memory_backend import MemoryDriver
from tn.logtail.wiring import attach_logtail
from tn.service.service import TnService

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "schemas"
READER = Path(__file__).with_name("third_party_reader.py")
KWAL_PACKAGES = ("schemas", "infra", "tn", "consumers", "producers", "tests")
TABLES = ["shop.orders", "shop.stock"]


def _concurrently(client: Client, first: int, threads: int, per_thread: int) -> list[int]:
    """Single-row inserts from several threads at once, sent before any is awaited, so
    the TN groups them into shared transactions. Their commit ts."""
    stamps: list[int] = []
    lock = threading.Lock()

    def send(n: int) -> None:
        futures = []
        for i in range(per_thread):
            key = first + n * per_thread + i
            t = client.begin()
            t.insert("shop.orders", [{"id": key, "item": f"i{key}", "qty": key % 7}])
            futures.append(t.commit_async())
        got = [f.result(timeout=30).commit_ts for f in futures]
        with lock:
            stamps.extend(got)

    workers = [threading.Thread(target=send, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert len(stamps) == threads * per_thread
    return stamps


def _tn_rows(engine: Engine, name: str, ts: int) -> list[dict[str, Any]] | None:
    db, table = name.split(".")
    if table not in engine.tables(ts).get(db, []):
        return None
    return sorted(engine.read(db, table, ts).to_pylist(), key=lambda r: r["id"])


def test_a_reader_without_kwal_rebuilds_the_tables(kwal_config: KwalConfig, tmp_path: Path) -> None:
    cfg = kwal_config
    cfg.tn.heartbeat_ms = 20
    ensure_topics(cfg)
    engine = Engine(LogStore(MemoryDriver()))
    store = FolderStore(tmp_path / "objects")
    runner = CheckpointRunner(engine, store)  # before any commit (its docstring)
    logtail = attach_logtail(engine, cfg)
    service = TnService(cfg, engine)
    service.start()
    stamps: list[int] = []
    try:
        with Client(cfg, "reader-test") as client:
            t = client.begin()
            t.create_database("shop")
            t.create_table("shop.orders", [("id", "int64"), ("item", "string"), ("qty", "int64")], "id")
            t.create_table("shop.stock", [("id", "int64"), ("left", "float64")], "id")
            t.insert("shop.stock", [{"id": k, "left": 100.0} for k in range(3)])
            stamps.append(t.commit(timeout=30).commit_ts)
            grouped = _concurrently(client, 0, threads=3, per_thread=8)
            assert len(set(grouped)) < len(grouped)  # some requests shared a transaction
            stamps += sorted(set(grouped))
            t = client.begin()  # multi-table: an order and its stock
            t.update("shop.orders", [{"id": 1, "item": "changed", "qty": 9}])
            t.update("shop.stock", [{"id": 1, "left": 91.0}])
            t.delete("shop.orders", [2, 3])
            stamps.append(t.commit(timeout=30).commit_ts)
            t = client.begin()  # a row inserted and deleted by one transaction
            t.insert("shop.orders", [{"id": 500, "item": "gone", "qty": 1}])
            t.delete("shop.orders", [500])
            t.insert("shop.orders", [{"id": 501, "item": "kept", "qty": 1}])
            stamps.append(t.commit(timeout=30).commit_ts)
            t = client.begin()
            t.add_column("shop.orders", "note", "string")
            stamps.append(t.commit(timeout=30).commit_ts)
            t = client.begin()
            t.update("shop.orders", [{"id": 4, "item": "i4", "qty": 4, "note": "after alter"}])
            t.insert("shop.orders", [{"id": 600, "item": "new", "qty": 2, "note": "n"}])
            stamps.append(t.commit(timeout=30).commit_ts)
            stamps += sorted(set(_concurrently(client, 1000, threads=2, per_thread=5)))
        final = engine.heartbeat().result(10)
        assert logtail.publisher.flush(20), logtail.publisher.errors

        res = subprocess.run(
            [sys.executable, str(READER), "--bootstrap", cfg.bootstrap,
             "--prefix", cfg.topics.prefix, "--tables", ",".join(TABLES),
             "--schemas", str(SCHEMAS), "--min-ts", str(final),
             "--at", ",".join(map(str, stamps))],
            cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120,
        )
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        kwal = [m for m in out["modules"] if m.split(".")[0] in KWAL_PACKAGES]
        assert kwal == [], f"the reader loaded kwal modules: {kwal}"
        assert "fastavro" in out["modules"] and "pyarrow" in out["modules"]

        mark = out["watermark"]
        assert mark >= final
        for name in TABLES:
            assert out["tables"][name] == _tn_rows(engine, name, mark), name
        orders = out["tables"]["shop.orders"]
        assert {r["id"] for r in orders} >= {0, 1, 501, 600, 1000} and 500 not in {r["id"] for r in orders}
        assert [r["note"] for r in orders if r["id"] in (4, 5)] == ["after alter", None]
        assert set(out["at"]) == {str(ts) for ts in stamps}
        for ts, tables in out["at"].items():
            for name in TABLES:
                assert tables[name] == _tn_rows(engine, name, int(ts)), (name, ts)

        # the checkpoint objects match their published JSON schemas
        manifest = runner.checkpoint()
        assert manifest is not None
        for key, schema in ((manifest.key, "checkpoint_manifest"), (manifest.catalog, "checkpoint_catalog")):
            doc = json.loads(store.get(key))
            jsonschema.validate(doc, json.loads((SCHEMAS / f"{schema}.schema.json").read_text()))
        catalog = json.loads(store.get(manifest.catalog))
        assert {t["name"] for t in catalog["tables"]} >= {"orders", "stock"}
        assert catalog["blocks"] and all(b["meta_loc"] for b in catalog["blocks"])
    finally:
        service.stop(drain_timeout_s=5)
        logtail.close()
        engine.close()
