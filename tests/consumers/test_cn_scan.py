"""CN reads stream (issue 33): a table is read batch by batch from its objects (through a
byte-bounded LRU cache) plus the in-memory tail, and `snapshot()` is that stream
collected. Checked against the TN's own reads; a real TN engine (in-process), its logtail
on the session's Kafka broker, a folder store."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from consumers.core.block_cache import BlockCache
from consumers.core.cn import CN
from consumers.core.table_state import TableState
from infra.config import KwalConfig
from infra.objectstore import FolderStore
from ops import cli
from ops.bench.cn_read import measure_cn_read
from schemas.arrow_ipc import table_to_ipc
from schemas.logtail import COMMIT_TS, ROW_ID, BlockMeta, Changes, make_row_id
from schemas.wal import ColumnDef, ColumnType, TableSchema
from tests.logtail.conftest import COLUMNS, Tn, start_tn
from tn.checkpoint.dump import to_parquet

TABLE = "db.a"
ROUNDS = 4
ROWS = 3000
BATCH_ROWS = 1000


@pytest.fixture
def tn(kwal_config: KwalConfig, tmp_path: Path) -> Iterator[Tn]:
    tn = start_tn(kwal_config, FolderStore(tmp_path / "objects"))
    # `history` checkpoints without waiting for the CN, which may then lag by more than a
    # checkpoint on a loaded machine: the logtail is not truncated (a truncated CN
    # bootstraps again, lifecycle-cn.md, and could no longer read the old ts checked here)
    tn.runner.truncate_logtail = None
    yield tn
    tn.close()


def history(tn: Tn) -> list[int]:
    """db.a through ROUNDS checkpoints (inserts, updates and deletes of rows flushed rounds
    ago), dropped and re-created, a checkpoint of the new table, then a tail in memory in
    the block that checkpoint flushed. The commit ts of every step."""
    stamps = [tn.create("a")]
    for r in range(ROUNDS):
        base = r * ROWS
        new = [{"id": i, "v": f"r{r} {i:06d}"} for i in range(base, base + ROWS)]
        stamps.append(tn.commit(lambda t, new=new: t.insert("db", "a", new)))
        # never a key deleted before: i % 89 is 1 or 2 for those
        upd = [{"id": i, "v": f"u{r}"} for i in range(0, base + ROWS, 97) if i % 89 not in (1, 2)]
        stamps.append(tn.commit(lambda t, upd=upd: t.update("db", "a", upd)))
        gone = [i for i in range(base, base + ROWS) if i % 89 == 1]
        gone += [i for i in range(base - ROWS, base) if i % 89 == 2]  # rows of the last round
        stamps.append(tn.commit(lambda t, gone=gone: t.delete("db", "a", gone)))
        tn.checkpoint()

    def recreate(t: object) -> None:
        t.drop_table("db", "a")  # type: ignore[attr-defined]
        t.create_table("db", "a", COLUMNS, "id")  # type: ignore[attr-defined]

    stamps.append(tn.commit(recreate))
    rows = [{"id": i, "v": f"new {i}"} for i in range(500)]
    stamps.append(tn.commit(lambda t: t.insert("db", "a", rows)))
    tn.checkpoint()
    stamps.append(tn.commit(lambda t: t.insert("db", "a", [{"id": i, "v": "tail"} for i in range(500, 700)])))
    stamps.append(tn.commit(lambda t: t.update("db", "a", [{"id": i, "v": "upd"} for i in range(0, 700, 7)])))
    stamps.append(tn.commit(lambda t: t.delete("db", "a", list(range(1, 700, 11)))))
    return stamps


def streamed(cn: CN, ts: int) -> tuple[list[dict[str, object]], int]:
    """The scan's rows sorted by key, and the largest batch it yielded."""
    batches = list(cn.scan(TABLE, ts))
    rows = pa.Table.from_batches(batches, schema=cn.scan(TABLE, ts).schema).sort_by("id").to_pylist()
    return rows, max((b.num_rows for b in batches), default=0)


def test_streamed_scan_equals_snapshot_and_the_tn_at_every_ts(tn: Tn, kwal_config: KwalConfig) -> None:
    kwal_config.cn.read_batch_rows = BATCH_ROWS
    cache_bytes = 200 << 10  # one block object of this table at most; the table is larger
    cn = CN(kwal_config, [TABLE], tn.store, bootstrap=False, cache_bytes=cache_bytes).start()
    try:
        stamps = history(tn)
        assert cn.wait_for(stamps[-1], TABLE, timeout_s=60), cn.errors
        assert 0 < cn.rows_in_memory() - cn.blocks.rows()  # the tail is in memory
        for ts in stamps[1:]:
            rows, biggest = streamed(cn, ts)
            assert rows == cn.snapshot(TABLE, ts).to_pylist() == tn.engine.read("db", "a", ts).to_pylist(), ts
            assert biggest <= BATCH_ROWS  # objects are read in slices
            assert cn.blocks.nbytes <= cache_bytes
        # a table larger than the cache: read whole twice, the second finds objects cached
        final = stamps[ROUNDS * 3]  # the old table, last round
        first = sum(b.get_total_buffer_size() for b in cn.scan(TABLE, final))
        assert first > cache_bytes
        reads, hits = cn.blocks.reads, cn.blocks.hits
        rows, _ = streamed(cn, final)
        assert rows == tn.engine.read("db", "a", final).to_pylist()
        assert cn.blocks.hits > hits  # cached objects were read first, before any eviction
        assert cn.blocks.reads > reads  # and the rest fetched again: it did not all fit
    finally:
        cn.close()


def test_kwal_cn_query_writes_the_snapshot(
    tn: Tn, kwal_config: KwalConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stamps = history(tn)
    assert tn.logtail.publisher.flush(20)
    for name, value in kwal_config.to_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KWAL_CONFIG", "/dev/null")
    monkeypatch.setenv("KWAL_OBJECTSTORE_URL", f"file://{tmp_path / 'objects'}")
    monkeypatch.setenv("KWAL_CN_READ_BATCH_ROWS", "100")
    monkeypatch.setenv("KWAL_CN_CACHE_BYTES", str(16 << 10))
    capsys.readouterr()
    assert cli.main(["cn", "query", "--table", TABLE, "--ts", str(stamps[-1]), "--json"]) == 0
    out, err = capsys.readouterr()
    got = sorted((json.loads(line) for line in out.splitlines()), key=lambda r: r["id"])
    expected = tn.engine.read("db", "a", stamps[-1]).to_pylist()
    assert len(expected) > 500 and got == expected
    assert f"({len(expected)} rows as of ts {stamps[-1]})" in err


def test_measure_cn_read_reads_the_whole_table(tn: Tn, kwal_config: KwalConfig, tmp_path: Path) -> None:
    """The bench's CN process (`kwal bench cn-read`, `kwal bench scale`) catches up with
    the TN and reads every row of the table."""
    stamps = history(tn)
    assert tn.logtail.publisher.flush(20)
    store = dataclasses.replace(kwal_config.objectstore, url=f"file://{tmp_path / 'objects'}")
    got = measure_cn_read(dataclasses.replace(kwal_config, objectstore=store), TABLE, timeout_s=60)
    assert got["cn_read_rows"] == tn.engine.read("db", "a", stamps[-1]).num_rows > 500
    assert got["cn_read_ts"] >= stamps[-1]
    assert got["cn_rss_mb_before_read"] > 0 and got["cn_read_peak_rss_growth_mb"] >= 0


SCHEMA = TableSchema((ColumnDef(1, "id", ColumnType.INT64), ColumnDef(2, "v", ColumnType.STRING)), "id")


def test_rows_both_in_an_object_and_in_memory_are_read_once(tmp_path: Path) -> None:
    """A BlockMeta whose drop_before_ts leaves rows in memory that its object holds too:
    each row once, deletes from the delta object and from memory both applied."""
    store = FolderStore(tmp_path / "objects")
    ids = [make_row_id(1, i) for i in range(10)]
    cts = list(range(10, 20))
    rows = pa.table({ROW_ID: pa.array(ids, pa.int64()), COMMIT_TS: pa.array(cts, pa.int64()),
                     "id": pa.array(range(10), pa.int64()), "v": [f"v{i}" for i in range(10)]})
    state = TableState("db", "t", 1, schemas=[(1, SCHEMA)], create_ts=1)
    state.apply_changes(Changes(inserts=table_to_ipc(rows)))
    for row, ts in ((ids[1], 12), (ids[7], 18)):
        gone = pa.table({ROW_ID: pa.array([row], pa.int64()), COMMIT_TS: pa.array([ts], pa.int64())})
        state.apply_changes(Changes(deletes=table_to_ipc(gone)))
    store.put("b1.parquet", to_parquet(rows.filter(pa.compute.less_equal(rows[COMMIT_TS], 15))))
    store.put("b1.delta.parquet", to_parquet(pa.table({ROW_ID: pa.array([ids[1]], pa.int64()),
                                                       COMMIT_TS: pa.array([12], pa.int64())})))
    state.apply_block_meta(BlockMeta(1, "b1.parquet", 13, "b1.delta.parquet"))
    assert state.rows_in_memory() == 7  # cts 13..19: 13..15 are in the object too
    cache = BlockCache(store.get, 1 << 20, batch_rows=2)
    for ts in range(10, 21):
        want = [i for i in range(10) if cts[i] <= ts and not (i == 1 and ts >= 12) and not (i == 7 and ts >= 18)]
        got = pa.Table.from_batches(list(state.scan(ts, cache)), schema=state.scan(ts, cache).schema)
        assert sorted(got.column("id").to_pylist()) == want, ts
        assert state.snapshot(ts, cache).column("id").to_pylist() == want, ts


def test_the_cache_never_holds_more_than_its_byte_limit(tmp_path: Path) -> None:
    store = FolderStore(tmp_path / "objects")
    rng = random.Random(33)
    sizes = {}
    for k in range(12):
        n = rng.randint(50, 3000)
        table = pa.table({"id": pa.array(range(n), pa.int64()), "v": [f"{k}-{i}" * 3 for i in range(n)]})
        store.put(f"o{k}.parquet", to_parquet(table))
        sizes[f"o{k}.parquet"] = n
    limit = 64 << 10
    cache = BlockCache(store.get, limit, batch_rows=500)
    for _ in range(60):
        key = rng.choice(list(sizes))
        got = list(cache.batches(key))
        assert sum(b.num_rows for b in got) == sizes[key]
        assert max(b.num_rows for b in got) <= 500
        assert cache.held_bytes() == cache.nbytes <= limit  # counted again from the batches
    big = max(sizes, key=lambda k: sizes[k])  # larger than the limit: streamed, never kept
    assert sum(b.get_total_buffer_size() for b in cache.batches(big)) > limit
    assert not cache.holds(big)
    assert cache.hits > 0 and cache.reads > len(sizes)  # hits, and misses after evictions
