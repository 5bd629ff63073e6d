from __future__ import annotations

import urllib.request

from infra.metrics import Metrics, serve
from infra.processes import free_port


def test_metrics_are_served_as_prometheus_text() -> None:
    m = Metrics()
    m.commits.inc(3)
    m.aborts.labels("write_conflict").inc()
    m.commit_latency.observe(0.004)
    port = free_port()
    serve(port, m)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "kwal_commits_total 3.0" in text
    assert 'kwal_aborts_total{reason="write_conflict"} 1.0' in text
    assert "kwal_commit_latency_seconds_bucket" in text
