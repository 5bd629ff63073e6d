"""Attach the logtail (publisher + heartbeats) to a running engine."""

from __future__ import annotations

from dataclasses import dataclass

from infra.config import KwalConfig
from tn.engine import Engine
from tn.logtail.engine_view import EngineCatalogView
from tn.logtail.heartbeat import Heartbeater
from tn.logtail.publisher import LogtailPublisher


@dataclass
class Logtail:
    publisher: LogtailPublisher
    heartbeater: Heartbeater | None

    def close(self) -> None:
        if self.heartbeater is not None:
            self.heartbeater.close()
        self.publisher.close()


def attach_logtail(engine: Engine, cfg: KwalConfig, heartbeats: bool = True) -> Logtail:
    """1. create the publisher (topics of every live table are ensured first);
    2. register it as commit and heartbeat listener (in LSN order with commits);
    3. start the heartbeat loop (cfg.tn.heartbeat_ms)."""
    live = [f"{db}.{t}" for db, tables in engine.tables().items() for t in tables]
    publisher = LogtailPublisher(cfg, EngineCatalogView(engine), live).start()
    engine.add_commit_listener(publisher.on_commit)
    engine.add_heartbeat_listener(publisher.on_heartbeat)
    beater = Heartbeater(engine, cfg.tn.heartbeat_ms).start() if heartbeats else None
    return Logtail(publisher, beater)
