"""Attach the logtail (publisher + heartbeats) to a running engine."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from infra.config import KwalConfig
from infra.kafka_txn import TxnChannel
from schemas.wal import WalEntry
from tn.engine import Engine
from tn.logtail.engine_view import EngineCatalogView
from tn.logtail.heartbeat import Heartbeater
from tn.logtail.publisher import LogtailPublisher


@dataclass
class Logtail:
    publisher: LogtailPublisher
    heartbeater: Heartbeater | None

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the heartbeats, then wait up to `timeout_s` for what was queued to be
        delivered."""
        if self.heartbeater is not None:
            self.heartbeater.close()
        self.publisher.close(timeout_s)


def attach_logtail(
    engine: Engine,
    cfg: KwalConfig,
    heartbeats: bool = True,
    republish: Iterable[WalEntry] = (),
    producer: TxnChannel | None = None,
) -> Logtail:
    """1. create the publisher (topics of every live table are ensured first);
    2. after a restart, publish again the logtail of every entry still in the WAL
       (`republish`): a crash can fall between an entry's commit and its push,
       and CNs drop what they already have by LSN, so pushing twice is harmless
       while pushing never would lose a commit;
    3. register it as commit and heartbeat listener (in LSN order with commits);
    4. start the heartbeat loop (cfg.tn.heartbeat_ms)."""
    live = [f"{db}.{t}" for db, tables in engine.tables().items() for t in tables]
    publisher = LogtailPublisher(cfg, EngineCatalogView(engine), live, producer)
    for entry in republish:
        publisher.on_commit(entry)
    publisher.start()
    engine.add_commit_listener(publisher.on_commit)
    engine.add_heartbeat_listener(publisher.on_heartbeat)
    beater = Heartbeater(engine, cfg.tn.heartbeat_ms).start() if heartbeats else None
    return Logtail(publisher, beater)
