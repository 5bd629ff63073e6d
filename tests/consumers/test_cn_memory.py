"""A Python CN's memory stays bounded as history grows (issue 30, item 6; seed 001,
"清理内存"): after each checkpoint it drops the in-memory rows of the blocks flushed
before the BlockMeta's ts and reads them from their objects when a read needs them,
keeping at most `cache_bytes` of objects. Measured deterministically: the rows it holds
(`CN.rows_in_memory`), across many checkpoints, against the rows the table has. A real
TN engine (in-process), its logtail on the session's Kafka broker, a folder store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.core.cn import CN
from infra.config import KwalConfig
from infra.objectstore import FolderStore
from tests.logtail.conftest import Tn, start_tn
from tests.waiting import wait_until
from tn.memtable.block import BLOCK_ROWS

TABLE = "db.a"
ROUNDS = 12
ROWS_PER_ROUND = 3000
CACHE_BYTES = 256 << 10  # about 5000 rows of this table


@pytest.fixture
def tn(kwal_config: KwalConfig, tmp_path: Path) -> Iterator[Tn]:
    tn = start_tn(kwal_config, FolderStore(tmp_path / "objects"))
    yield tn
    tn.close()


def insert_round(tn: Tn, r: int) -> int:
    first = r * ROWS_PER_ROUND
    rows = [{"id": i, "v": f"row {i:08d}"} for i in range(first, first + ROWS_PER_ROUND)]
    return tn.commit(lambda t: t.insert("db", "a", rows))


def test_a_python_cn_holds_bounded_rows_across_many_checkpoints(
    tn: Tn, kwal_config: KwalConfig
) -> None:
    tn.create("a")
    cn = CN(kwal_config, [TABLE], tn.store, bootstrap=False, cache_bytes=CACHE_BYTES).start()
    held: list[int] = []
    try:
        for r in range(ROUNDS):
            ts = insert_round(tn, r)
            assert cn.wait_for(ts, TABLE, timeout_s=60), cn.errors
            # before the checkpoint the round's rows are in memory
            assert cn.rows_in_memory() >= ROWS_PER_ROUND
            m = tn.checkpoint()
            wait_until(
                "the CN applied the checkpoint's records",
                lambda m=m: cn.last_checkpoint is not None and cn.last_checkpoint[0] >= m.ts,
            )
            # the table's watermark also needs the catalog topic's mark at m.ts, which may
            # come in a later poll than the checkpoint's record on the table's topic
            assert cn.wait_for(m.ts, TABLE, timeout_s=60), cn.errors
            # every row is flushed before the BlockMeta's ts: none is left in memory
            versions = cn.tables[TABLE]
            assert sum(v.rows_in_memory() for v in versions) == 0
            # a read at the checkpoint fetches the objects (through the bounded cache) and
            # agrees with the TN
            snap = cn.snapshot(TABLE, m.ts)
            assert snap.num_rows == (r + 1) * ROWS_PER_ROUND
            assert snap.to_pylist() == tn.engine.read("db", "a", m.ts).to_pylist()
            assert cn.blocks.nbytes <= CACHE_BYTES or cn.blocks.rows() <= BLOCK_ROWS
            held.append(cn.rows_in_memory())
    finally:
        cn.close()
    assert cn.blocks.reads > ROUNDS  # objects were read again after being evicted
    # what it holds: the cache's objects (under CACHE_BYTES, plus the last one read, a
    # block object being at most BLOCK_ROWS rows), however many rows the table has
    assert max(held) <= 2 * BLOCK_ROWS < ROUNDS * ROWS_PER_ROUND, held
