"""Replay a record at a time (`tn.replay.apply_groups`): a log whose entries are stored in
groups of WAL record format version 3 (one-block Appends as int64 columns, the other
entries as Avro records) replays into the same physical state as entry by entry, with
the workload's holes, deletes, updates, DDL, multi-block inserts and concurrent commits
in one record; and a bulk place refuses what `place` refuses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from schemas.codec import decode_entry
from schemas.wal_record import A_BLOCK, A_ROW, RECORD_V3, LazyGroup, encode_v2, encode_v3
from tests.tn.helpers import new_engine, setup_table
from tests.tn.test_replay import _workload
from tn.catalog.nodes import ABORTED_TS, BlockNode, TableNode
from tn.engine import Engine
from tn.exceptions import TnError
from tn.logstore.driver import LogRecord, LogStore, RecordRun
from tn.logstore.memory_backend import MemoryDriver
from tn.replay import apply_entry, apply_groups, physical_state

# the workload's keys (tests.tn.test_replay._workload)
_KEYS = {"t": [*range(9000), *range(100_000, 100_300)], "w": ["a", "b", "c"]}


def _indexes(e: Engine) -> dict[str, dict[object, tuple[int, int, int, bool]]]:
    """Per table, each workload key's newest write as the key index answers it."""
    out = {}
    for n in e.catalog.nodes.values():
        if isinstance(n, TableNode) and (n.db.name, n.name) in (("db", "t"), ("db2", "w")):
            found = n.mem.lookup_many(_KEYS[n.name])
            out[n.name] = {k: (b.id, row, ts, live) for k, (b, row, ts, live) in found.items()}
    return out


class GroupedDriver(MemoryDriver):
    """A memory log that hands its entries over as records of `size` entries, encoded in
    WAL record format `version` (what the Kafka driver does with the records it read)."""

    def __init__(self, source: LogStore, size: int, version: int) -> None:
        super().__init__()
        self.size = size
        self.version = version
        for r in source.records():
            self.append(r.lsn, r.payload).result(10)

    def runs(self, from_lsn: int, max_bytes: int = 4 << 20) -> Iterator[LogRecord | RecordRun]:
        records = list(self.read(from_lsn, 1 << 40)[0])
        encode = encode_v3 if self.version == RECORD_V3 else encode_v2
        for i in range(0, len(records), self.size):
            part = records[i : i + self.size]
            entries = [decode_entry(r.payload) for r in part]
            first, last = part[0].lsn, part[-1].lsn
            value = encode(entries, first)
            group = LazyGroup(value, self.version, first, len(part), f"test@{i}")
            # a run may start inside its record (the log's head was truncated there)
            lo = first + 1 if i == 0 and len(part) > 1 else first
            if lo != first:
                yield LogRecord(first, part[0].payload)
            yield RecordRun(lo, last, group)


def test_replay_a_record_at_a_time_reproduces_physical_state() -> None:
    e, log = new_engine()
    _workload(e)
    before = physical_state(e.catalog)
    visible = e.visible_ts
    tables = {db: {t: e.read(db, t) for t in ts} for db, ts in e.tables().items()}
    e.close()
    one_by_one = Engine.recover(log)
    index = _indexes(one_by_one)
    assert len(index["t"]) > 9000 and len(index["w"]) == 3
    for size, version in [(8, RECORD_V3), (64, RECORD_V3)]:
        r = Engine.recover(LogStore(GroupedDriver(log, size, version)))
        assert physical_state(r.catalog) == before, (size, version)
        assert r.visible_ts == visible
        for db, ts in tables.items():
            for t, data in ts.items():
                assert r.read(db, t).equals(data)
        # the key index: what entry-by-entry replay builds (block, row, ts, live) per key
        assert _indexes(r) == index, (size, version)
    # and it serves the conflict check: a write older than the key's newest conflicts (on
    # a key live after the workload: its concurrent clients may have deleted any one key)
    key = next(k for k, (_, _, _, live) in sorted(index["t"].items()) if live and k >= 100_000)
    stale = r.begin()
    fresh = r.begin()
    stale.update("db", "t", [{"id": key, "v": "stale"}])
    fresh.delete("db", "t", [key])
    fresh.commit().result(timeout=10)
    with pytest.raises(TnError) as err:
        stale.commit().result(timeout=10)
    assert err.value.code == "write_conflict"
    # new ids come after every replayed one
    max_id = max(r.catalog.nodes)
    txn = r.begin()
    txn.create_table("db", "after", [("id", "int64")], "id")
    txn.commit().result(timeout=10)
    assert max(r.catalog.nodes) > max_id


def test_bulk_place_refuses_taken_rows_and_rows_past_the_block() -> None:
    e, _ = new_engine()
    setup_table(e)
    txn = e.begin()
    txn.insert("db", "t", [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
    txn.commit().result(timeout=10)
    t = next(n for n in e.catalog.nodes.values() if isinstance(n, TableNode) and n.name == "t")
    blk = next(n for n in e.catalog.nodes.values() if isinstance(n, BlockNode))
    cid = t.mem.pk_cid()
    with pytest.raises(ValueError, match=f"block {blk.id}: row 1 is already taken"):
        t.mem.place_rows(blk, [1, 3], {cid: [10, 11]}, [7, 8], ABORTED_TS)
    with pytest.raises(ValueError, match="placed twice"):
        t.mem.place_rows(blk, [5, 5], {cid: [10, 11]}, [7, 8], ABORTED_TS)
    with pytest.raises(ValueError, match="outside its 8192 rows"):
        t.mem.place_rows(blk, [8191, 8192], {cid: [10, 11]}, [7, 8], ABORTED_TS)
    # out of order, past the end: the gap becomes placeholders, each row its own ts
    t.mem.place_rows(blk, [6, 4], {cid: [16, 14], 2: ["six", "four"]}, [7, 8], ABORTED_TS)
    assert blk.mem.cts.tolist()[2:] == [ABORTED_TS, ABORTED_TS, 8, ABORTED_TS, 7]
    assert blk.mem.cols[cid][4] == 14 and blk.mem.cols[cid][6] == 16
    assert blk.mem.arrays(7)[2].to_pylist() == ["a", "b", None, None, "four", None, "six"]


def test_a_run_takes_rows_out_of_batch_order() -> None:
    """Appends whose rows are not in their batch's order (a batch's rows 2, 1, 0 into
    block rows 1, 2, 3) land where their entries say: the run takes those rows of the
    batch, not a slice of it."""
    e, log = new_engine()
    setup_table(e)
    for k in (9, 10, 11, 12):  # 9 creates the block (an entry that is not an `appends` row)
        txn = e.begin()
        txn.insert("db", "t", [{"id": k, "v": f"v{k}"}])
        txn.commit().result(timeout=10)
    records = list(log.records())
    e.close()
    ddl, appends = records[:-3], records[-3:]
    value = encode_v3([decode_entry(r.payload) for r in appends], appends[0].lsn)
    group = LazyGroup(value, RECORD_V3, appends[0].lsn, 3, "test").group()
    assert group.appends[A_ROW] == [0, 1, 2] and group.tables[0] is not None
    group.appends[A_ROW] = [2, 1, 0]  # entry i now takes the batch's row 2 - i
    fresh = Engine(LogStore(MemoryDriver()))
    for r in ddl:
        apply_entry(fresh.catalog, decode_entry(r.payload))
    done = apply_groups(fresh.catalog, [(group, appends[0].lsn, appends[-1].lsn)])
    assert done.lsns == [r.lsn for r in appends] and done.memos[0] == (group.appends[A_BLOCK][0],)
    assert group.tables == [None]  # the batch as read is let go once its rows are placed
    t = next(n for n in fresh.catalog.nodes.values() if isinstance(n, TableNode) and n.name == "t")
    blk = next(n for n in fresh.catalog.nodes.values() if isinstance(n, BlockNode))
    assert blk.mem.cols[t.mem.pk_cid()][:4] == [9, 12, 11, 10]
    found = t.mem.lookup_many([10, 12])
    assert (found[12][1], found[10][1]) == (1, 3)  # the key index names the same rows
    fresh.close()
