"""The TN's scheduled compaction: the policy (tn.checkpoint.policy) applied to every
table in the background, and on demand (`kwal ops compact`, tn.service.ops_listener).

One pass, per table (or the one table asked for):

1. take the checkpoint runner's lock (`CheckpointRunner.exclusive`): a checkpoint and a
   compaction never run at once;
2. snapshot ts = the engine's visible ts; `policy.plan` picks the blocks to rewrite;
3. one block: `compact_block`; several: `merge_blocks`. Either commits a metadata-only
   WAL entry (UpdateCatalog, reason COMPACT or MERGE: seed 004) and publishes the new
   and deleted blocks' BlockMeta on the table's logtail topic, which CNs follow;
4. a conflict (a key written meanwhile) leaves the table as it was until the next pass.

The objects of the replaced blocks stay in the store; the next checkpoint's manifest no
longer lists them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from infra.metrics import METRICS
from infra.objectstore import ObjectStore
from tn.checkpoint.compaction import Publish, compact_block, merge_blocks
from tn.checkpoint.policy import CompactionPolicy, block_stats
from tn.exceptions import ConflictError, TnError, ValidationError

log = logging.getLogger("kwal.tn.compaction")


@dataclass
class Compacted:
    """One table's compaction in a pass (`error` set when it did not commit)."""

    table: str
    blocks: list[int]
    live_rows: int
    commit_ts: int = 0
    error: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "blocks": self.blocks,
            "live_rows": self.live_rows,
            "commit_ts": self.commit_ts,
            "error": self.error,
        }


class CompactionScheduler:
    def __init__(
        self,
        engine: Any,
        store: ObjectStore,
        policy: CompactionPolicy,
        *,
        interval_s: float = 30.0,
        exclusive: threading.Lock | None = None,
        publish: Publish | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.policy = policy
        self.interval_s = interval_s
        self._exclusive = exclusive
        self.publish = publish
        self.passes = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _locked(self) -> AbstractContextManager[Any]:
        return self._exclusive if self._exclusive is not None else nullcontext()

    def run_once(self, table: str | None = None) -> list[Compacted]:
        """One pass over every table, or over `table` ("db.t"; ValidationError when no
        such table exists). Returns what was compacted (nothing: the policy found
        nothing to do)."""
        with self._locked():
            ts = self.engine.visible_ts
            tables = self.engine.tables(ts)
            names = [(db, t) for db, ts_ in tables.items() for t in ts_]
            if table is not None:
                db, _, name = table.partition(".")
                if (db, name) not in names:
                    raise ValidationError("unknown_table", f"unknown table {table!r}")
                names = [(db, name)]
            out = [c for db, name in names if (c := self._table(db, name, ts)) is not None]
            self.passes += 1
            return out

    def _table(self, database: str, name: str, ts: int) -> Compacted | None:
        cat = self.engine.catalog
        db = cat.database(database, ts)
        t = cat.table(db, name, ts) if db is not None else None
        if t is None:  # dropped since
            return None
        blocks = self.policy.plan(t, ts)
        if not blocks:
            return None
        done = Compacted(
            f"{database}.{name}", [b.id for b in blocks], sum(block_stats(b, ts).live for b in blocks)
        )
        try:
            if len(blocks) == 1:
                done.commit_ts = compact_block(
                    self.engine, self.store, database, name, blocks[0].id, self.publish
                )
            else:
                done.commit_ts = merge_blocks(
                    self.engine, self.store, database, name, done.blocks, self.publish
                )
        except (ConflictError, ValidationError) as e:  # written or altered meanwhile
            done.error = str(e)
            log.info("compaction of %s deferred: %s", done.table, e)
            return done
        METRICS.compactions.inc()
        METRICS.compacted_blocks.inc(len(blocks))
        log.info("compacted %s: blocks %s (%d live rows) at %s", done.table, done.blocks,
                 done.live_rows, done.commit_ts)
        return done

    # -- background ------------------------------------------------------------------------
    def start(self) -> CompactionScheduler:
        if self.interval_s <= 0:
            return self

        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                try:
                    self.run_once()
                except TnError as e:  # the engine closed, a log failure: the owner acts
                    self.errors.append(repr(e))
                    return
                except Exception as e:
                    log.exception("compaction pass failed")
                    self.errors.append(repr(e))

        self._thread = threading.Thread(target=loop, name="kwal-compaction", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


def start_compaction(
    engine: Any,
    store: ObjectStore,
    policy: CompactionPolicy,
    interval_s: float,
    exclusive: threading.Lock | None = None,
    publish: Callable[[list[Any]], None] | None = None,
) -> CompactionScheduler:
    return CompactionScheduler(
        engine, store, policy, interval_s=interval_s, exclusive=exclusive, publish=publish
    ).start()
