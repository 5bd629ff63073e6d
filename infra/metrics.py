"""Prometheus metrics of a kwal process, served as text on a local port.

One registry per process (`METRICS`); components update it, `serve(port)`
exposes it on 127.0.0.1 (set `[tn] metrics_port`; 0 = off).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.commits = Counter("kwal_commits", "committed transactions", registry=r)
        self.aborts = Counter("kwal_aborts", "aborted transactions", ["reason"], registry=r)
        self.commit_latency = Histogram(
            "kwal_commit_latency_seconds",
            "request received to result published",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
            registry=r,
        )
        self.wal_bytes_since_checkpoint = Gauge(
            "kwal_wal_bytes_since_checkpoint", "WAL bytes appended since the last checkpoint", registry=r
        )
        self.window_occupancy = Gauge(
            "kwal_wal_window_occupancy", "WAL entries issued but not yet acknowledged", registry=r
        )
        self.logtail_lag = Gauge(
            "kwal_logtail_lag_entries", "committed entries not yet published to logtail topics", registry=r
        )
        self.last_checkpoint_ts = Gauge("kwal_last_checkpoint_ts", "ts of the last checkpoint", registry=r)
        self.compactions = Counter(
            "kwal_compactions", "compactions/merges committed (metadata-only WAL entries)", registry=r
        )
        self.compacted_blocks = Counter(
            "kwal_compacted_blocks", "flushed blocks replaced by compactions", registry=r
        )


METRICS = Metrics()


def serve(port: int, metrics: Metrics = METRICS) -> None:
    """Serve the registry as Prometheus text on 127.0.0.1:port (a daemon thread)."""
    start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
