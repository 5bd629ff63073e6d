"""TN -> logtail topics -> CN, on the real broker."""

from __future__ import annotations

import pytest

from consumers.core.cn import CN
from infra.config import KwalConfig
from infra.topics import ensure_topics
from tn.engine import Engine
from tn.logstore.driver import LogStore
from tn.logstore.memory_backend import MemoryDriver
from tn.logtail.engine_view import EngineCatalogView
from tn.logtail.publisher import LogtailPublisher


@pytest.fixture
def tn(kwal_config: KwalConfig):  # type: ignore[no-untyped-def]
    ensure_topics(kwal_config)
    engine = Engine(LogStore(MemoryDriver()))
    pub = LogtailPublisher(kwal_config, EngineCatalogView(engine)).start()
    engine.add_commit_listener(pub.on_commit)
    yield engine, pub
    pub.close()
    engine.close()


def test_cn_follows_tn_at_every_commit_ts(tn, kwal_config: KwalConfig) -> None:  # type: ignore[no-untyped-def]
    engine, pub = tn
    t = engine.begin()
    t.create_database("db")
    t.create_table("db", "t", [("id", "int64"), ("v", "string")], "id")
    stamps = [t.commit().result(10)]
    for i in range(20):
        t = engine.begin()
        t.insert("db", "t", [{"id": i, "v": f"v{i}"}, {"id": 100 + i, "v": "x"}])
        if i % 3 == 0 and i:
            t.delete("db", "t", [i - 1])
        if i % 4 == 0 and i:
            t.update("db", "t", [{"id": 100 + i - 1, "v": "updated"}])
        stamps.append(t.commit().result(10))
    assert pub.flush(20), pub.errors
    cn = CN(kwal_config, ["db.t"]).start()
    try:
        assert cn.wait_for(stamps[-1], timeout_s=30), (cn.watermark(), cn.errors)
        for ts in stamps[1:]:
            assert cn.snapshot("db.t", ts).to_pylist() == engine.read("db", "t", ts).to_pylist(), ts
        assert cn.errors == []
    finally:
        cn.close()
