from __future__ import annotations

import urllib.request

from infra.metrics import Metrics, observe_all, serve
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


def _samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in m.registry.collect()
        if metric.name == "kwal_commit_latency_seconds"
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def test_observe_all_equals_one_observe_per_amount() -> None:
    """The TN observes a commit group's latencies with one `observe_all`: every bucket,
    the count and the sum come out as with one `observe` per latency -- amounts on a
    bucket's bound, between bounds, below the first and above the last included."""
    amounts = [0.0, 0.0005, 0.001, 0.0015, 0.002, 0.05, 0.05, 0.7, 5.0, 6.5, 120.0]
    one, many = Metrics(), Metrics()
    for a in amounts:
        one.commit_latency.observe(a)
    observe_all(many.commit_latency, amounts)
    observe_all(many.commit_latency, [])
    want = _samples(one)
    assert want[("kwal_commit_latency_seconds_count", ())] == len(amounts)
    assert _samples(many) == want
