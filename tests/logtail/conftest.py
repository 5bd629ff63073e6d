"""The logtail tests' TN: an engine on an in-memory log, its logtail on the session's
broker, and a checkpoint runner that records the logtail's offsets and truncates it."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.config import KwalConfig
from infra.objectstore import FolderStore, ObjectStore
from infra.topics import ensure_topics
from tn.checkpoint.compaction import compact_block
from tn.checkpoint.manifest import Manifest
from tn.checkpoint.runner import CheckpointRunner
from tn.engine import Engine
from tn.exceptions import TnError
from tn.logstore.driver import LogStore
from tn.logstore.memory_backend import MemoryDriver
from tn.logtail.truncation import LogtailTruncator
from tn.logtail.wiring import Logtail, attach_logtail
from tn.memtable.block import BLOCK_ROWS
from tn.txn.transaction import Transaction

COLUMNS = [("id", "int64"), ("v", "string")]


@dataclass
class Tn:
    engine: Engine
    logtail: Logtail
    runner: CheckpointRunner
    truncator: LogtailTruncator
    store: ObjectStore

    def commit(self, fn: Callable[[Transaction], object]) -> int:
        t = self.engine.begin()
        fn(t)
        return t.commit().result(30)

    def create(self, *tables: str) -> int:
        """Create database db and tables db.<name> (id int64 primary key, v string)."""

        def ddl(t: Transaction) -> None:
            t.create_database("db")
            for name in tables:
                t.create_table("db", name, COLUMNS, "id")

        return self.commit(ddl)

    def checkpoint(self) -> Manifest:
        m = self.runner.checkpoint()
        assert m is not None
        assert self.runner.errors == []
        return m

    def close(self) -> None:
        self.logtail.close()
        self.engine.close()


def random_txn(
    engine: Engine,
    rng: random.Random,
    step: int,
    *,
    keys: int,
    alter: float,
    droppable: tuple[str, ...] = ("a", "b"),
    timeout_s: float = 30.0,
) -> int | None:
    """One seeded random transaction on db.a or db.b: a drop + re-create (3%, tables in
    `droppable` only), an added column `c<step>` (up to `alter`), else updates of some
    of `keys` keys and a delete of one. Its commit ts; None when it aborted."""
    t = engine.begin()
    table = rng.choice(["a", "b"])
    try:
        roll = rng.random()
        if roll < 0.03 and table in droppable:
            t.drop_table("db", table)
            t.create_table("db", table, COLUMNS, "id")
        elif roll < alter:
            t.add_column("db", table, f"c{step}", "int64")
        else:
            sample = rng.sample(range(keys), rng.randint(1, 4))
            for k in sample[:-1]:
                t.update("db", table, [{"id": k, "v": f"s{step}"}])
            t.delete("db", table, [sample[-1]])
        return t.commit().result(timeout_s)
    except TnError:
        t.rollback()
        return None


def random_steps(tn: Tn, rng: random.Random, steps: int, stamps: list[int]) -> None:
    """Seeded DML on db.a and db.b, with the odd add column, and drop + re-create of b
    (db.a keeps the compacted block of `checkpoint_then_compact`). A column's name comes
    from the count of commits so far, unique across calls. Commit ts go to `stamps`."""
    for _ in range(steps):
        ts = random_txn(tn.engine, rng, len(stamps), keys=60, alter=0.06, droppable=("b",))
        if ts is not None:
            stamps.append(ts)


def checkpoint_then_compact(tn: Tn, rng: random.Random, steps: int, stamps: list[int]) -> Manifest:
    """db.a and db.b created, a full block of db.a, `steps` random transactions, a
    checkpoint (returned), then that block compacted (its deleted rows folded away; the new
    objects published as a BlockMeta)."""
    tn.create("a", "b")
    rows = [{"id": i, "v": "big"} for i in range(1000, 1000 + BLOCK_ROWS + 10)]
    stamps.append(tn.commit(lambda t: t.insert("db", "a", rows)))
    random_steps(tn, rng, steps, stamps)
    first = tn.checkpoint()
    db = tn.engine.catalog.database("db", first.ts)
    assert db is not None
    table_a = tn.engine.catalog.table(db, "a", first.ts)
    assert table_a is not None
    full = table_a.mem.blocks[0]
    publish = tn.logtail.publisher.publish_records
    stamps.append(compact_block(tn.engine, tn.store, "db", "a", full.id, publish=publish))
    return first


def start_tn(
    cfg: KwalConfig, store: ObjectStore, heartbeats: bool = True, physical: bool | None = None
) -> Tn:
    ensure_topics(cfg)
    # heartbeats at the default interval (200 ms), not faster: at 20 ms an idle TN cost the
    # broker 8-15% of a core, and a topic written every 20 ms never gives a Spark source's
    # end probe (`consumers.spark.kafka_io`, 50 ms fetch wait) the empty fetch that ends it,
    # so every available-now start and catalog read waited out its 10 s bound
    engine = Engine(LogStore(MemoryDriver()))
    logtail = attach_logtail(engine, cfg, heartbeats=heartbeats)
    truncator = LogtailTruncator(cfg, physical=physical)
    runner = CheckpointRunner(
        engine,
        store,
        publish=logtail.publisher.publish_records,
        logtail_offsets=logtail.publisher.offsets,
        truncate_logtail=truncator,
    )
    return Tn(engine, logtail, runner, truncator, store)


@pytest.fixture(params=["folder", "s3"])
def tn(request: pytest.FixtureRequest, kwal_config: KwalConfig, tmp_path: Path) -> Iterator[Tn]:
    """On the local-folder store and on the S3 API (moto server)."""
    store: ObjectStore
    if request.param == "s3":
        store = request.getfixturevalue("s3_store")
    else:
        store = FolderStore(tmp_path / "objects")
    tn = start_tn(kwal_config, store)
    yield tn
    tn.close()


