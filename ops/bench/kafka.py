"""The Kafka a benchmark runs against: the configured one, or a local broker it starts."""

from __future__ import annotations

import dataclasses
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.config import KwalConfig
from infra.processes import ServerProcess, port_open


@contextmanager
def bench_kafka(
    cfg: KwalConfig, name: str
) -> Iterator[tuple[KwalConfig, str, ServerProcess | None]]:
    """Yield (config with a fresh topic prefix and object store, "local kafka" or the address
    used, the local broker's process or None).

    1. if something answers at cfg.bootstrap, use it;
    2. otherwise start a local broker (Apache Kafka) and stop it on exit;
    3. either way the bench's topics get a prefix of their own, and its checkpoints a
       temporary folder of their own (recovery refuses another WAL's checkpoint, and a
       bench must not leave one in the configured store).
    """
    broker = None
    work = tempfile.TemporaryDirectory(prefix=f"kwal-bench-{name}-")
    if not port_open(cfg.bootstrap.split(",")[0]):
        from infra.brokers.local import DEFAULT_BROKER, start_local_broker

        broker = start_local_broker(DEFAULT_BROKER, Path(work.name) / "broker")
        cfg = cfg.with_bootstrap(broker.address)
    topics = dataclasses.replace(cfg.topics, prefix=f"bench-{name}-{uuid.uuid4().hex[:8]}")
    objects = dataclasses.replace(cfg.objectstore, url=f"file://{work.name}/objects")
    try:
        yield (
            dataclasses.replace(cfg, topics=topics, objectstore=objects),
            f"local {DEFAULT_BROKER}" if broker else cfg.bootstrap,
            broker,
        )
    finally:
        if broker is not None:
            broker.stop()
        work.cleanup()
