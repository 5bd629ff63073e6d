"""Prometheus metrics of a kwal process, served as text on a local port.

One registry per process (`METRICS`); components update it, `serve(port)`
exposes it on 127.0.0.1 (set `[tn] metrics_port`; 0 = off). The TN's gauges are
set by its sampler (tn.service.metrics_sampler) every `tn.metrics_interval_s`; a
CN's are read when scraped (consumers.core.cn). docs/metrics.md lists them all, and
infra/monitoring/ has the alert rules and a Grafana dashboard built on them.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # -- the TN ------------------------------------------------------------------------
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
        self.wal_entries_since_checkpoint = Gauge(
            "kwal_wal_entries_since_checkpoint", "WAL entries appended since the last checkpoint", registry=r
        )
        self.window_occupancy = Gauge(
            "kwal_wal_window_occupancy",
            "the most WAL entries issued but not yet acknowledged at once since the previous sample",
            registry=r,
        )
        self.wal_last_lsn = Gauge("kwal_wal_last_lsn", "the newest LSN issued", registry=r)
        self.wal_truncated_lsn = Gauge(
            "kwal_wal_truncated_lsn", "the WAL's durable truncation point (LSN)", registry=r
        )
        self.logtail_lag = Gauge(
            "kwal_logtail_lag_entries",
            "the most committed entries not yet published to logtail topics at once since the "
            "previous sample",
            registry=r,
        )
        self.last_checkpoint_ts = Gauge("kwal_last_checkpoint_ts", "ts of the last checkpoint", registry=r)
        self.last_checkpoint_age = Gauge(
            "kwal_last_checkpoint_age_seconds",
            "seconds since the last checkpoint was written (since the TN started, before its first)",
            registry=r,
        )
        self.retention_headroom = Gauge(
            "kwal_wal_retention_headroom_seconds",
            "seconds until retention could delete a WAL entry no checkpoint covers yet "
            "(+Inf: unlimited retention)",
            registry=r,
        )
        self.log_failures = Counter(
            "kwal_log_failures", "WAL failures that stopped the engine", ["kind"], registry=r
        )
        self.compactions = Counter(
            "kwal_compactions", "compactions/merges committed (metadata-only WAL entries)", registry=r
        )
        self.compacted_blocks = Counter(
            "kwal_compacted_blocks", "flushed blocks replaced by compactions", registry=r
        )
        self.security_dropped = Counter(
            "kwal_security_dropped",
            "records secure mode dropped because no principal could be addressed "
            "(tn.service.gateway)",
            ["what"],
            registry=r,
        )
        self.reader_reassigned = Counter(
            "kwal_reader_reassigned",
            "times a Kafka reader (label reader: requests, logtail, results) was assigned its "
            "partitions again after it polled nothing with records waiting (infra.reader_stall)",
            ["reader"],
            registry=r,
        )
        self.reader_replaced = Counter(
            "kwal_reader_replaced",
            "times a Kafka reader (label reader: requests, logtail, results) was given a new "
            "Kafka client after its stall checks failed to read its partitions' ends "
            "LOST_AFTER times in a row (infra.reader_stall, step 5)",
            ["reader"],
            registry=r,
        )
        self.producer_replaced = Counter(
            "kwal_producer_replaced",
            "times a client process's requests producer was replaced by a new one after "
            "LOST_AFTER checks in a row could not reach a broker (producers.client)",
            registry=r,
        )
        # -- a CN --------------------------------------------------------------------------
        self.cn_watermark = Gauge(
            "kwal_cn_watermark_ts", "the CN's watermark (every table it follows)", ["cn"], registry=r
        )
        self.cn_lag = Gauge(
            "kwal_cn_watermark_lag_seconds",
            "wall-clock seconds the CN's watermark is behind now",
            ["cn"],
            registry=r,
        )
        self.cn_records = Counter(
            "kwal_cn_applied_records", "logtail records the CN applied", ["cn"], registry=r
        )


METRICS = Metrics()


def observe_all(hist: Histogram, amounts: Sequence[float]) -> None:
    """`hist.observe(a)` for every a in `amounts`, as one update per touched bucket and one
    of the sum. The TN observes a commit group's latencies together: `observe` takes two
    locks and walks the buckets per call, which was a visible share of the TN's CPU per
    one-row commit (docs/perf-commit.md). The bucket of an amount is the first whose upper
    bound is >= it, as `observe` picks it (the last bound is +Inf). It reads the
    histogram's bucket and sum values (prometheus_client's own attributes, the same ones
    `observe` updates): tests/infra/test_metrics.py holds it to `observe`'s
    result, so a prometheus_client that renames them fails there."""
    if not amounts:
        return
    hist._raise_if_not_observable()
    bounds = hist._upper_bounds
    counts = [0] * len(bounds)
    last = len(bounds) - 1
    for a in amounts:
        i = bisect_left(bounds, a)
        counts[i if i <= last else last] += 1
    hist._sum.inc(sum(amounts))
    for bucket, n in zip(hist._buckets, counts, strict=True):
        if n:
            bucket.inc(n)


def serve(port: int, metrics: Metrics = METRICS) -> None:
    """Serve the registry as Prometheus text on 127.0.0.1:port (a daemon thread)."""
    start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
