"""The whole path on real components: producers -> TN process -> WAL -> logtail -> CN,
across a SIGKILL of the TN."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.core.cn import CN
from infra.config import KwalConfig
from infra.topics import ensure_topics
from producers import Client
from tn.service.process import TnProcess

pytestmark = pytest.mark.tansu  # the compatibility subset: also runs on the embedded broker


def test_cn_agrees_with_tn_across_a_tn_kill(kwal_config: KwalConfig, tmp_path: Path) -> None:
    cfg = kwal_config
    cfg.tn.heartbeat_ms = 20
    ensure_topics(cfg)
    tn = TnProcess(cfg, tmp_path)
    tn.start()
    cn = None
    try:
        with Client(cfg, "e2e") as client:
            t = client.begin()
            t.create_database("shop")
            t.create_table("shop.orders", [("id", "int64"), ("item", "string"), ("qty", "int64")], "id")
            t.commit(timeout=30)
            cn = CN(cfg, ["shop.orders"]).start()
            acked: dict[int, dict[str, object]] = {}
            for i in range(30):
                t = client.begin()
                row = {"id": i, "item": f"item{i}", "qty": i}
                t.insert("shop.orders", [row])
                t.commit(timeout=30)
                acked[i] = row
            t = client.begin()
            t.delete("shop.orders", [0, 1])
            t.update("shop.orders", [{"id": 2, "item": "changed", "qty": 99}])
            last = t.commit(timeout=30)
            del acked[0], acked[1]
            acked[2] = {"id": 2, "item": "changed", "qty": 99}

            tn.kill()  # SIGKILL: the CN keeps its state and its position
            tn.start()
            for i in range(30, 40):
                t = client.begin()
                row = {"id": i, "item": f"item{i}", "qty": i}
                t.insert("shop.orders", [row])
                last = t.commit(timeout=30)
                acked[i] = row
            assert cn.wait_for(last.commit_ts, "shop.orders", timeout_s=30), cn.errors
            assert cn.snapshot("shop.orders", last.commit_ts).to_pylist() == [acked[k] for k in sorted(acked)]
            # a CN started after the restart reads everything again and agrees
            late = CN(cfg, ["shop.orders"]).start()
            try:
                assert late.wait_for(last.commit_ts, timeout_s=30)
                assert late.snapshot("shop.orders", last.commit_ts).to_pylist() == [
                    acked[k] for k in sorted(acked)
                ]
            finally:
                late.close()
            assert cn.errors == []
    finally:
        if cn is not None:
            cn.close()
        tn.kill()
