"""Known failure shapes from MatrixOne's logtail (seed 001), reproduced on kwal:

1. a delete committed while its block is being dumped to object storage must not be
   lost (neither by the TN dropping the block's memory nor by a CN applying the
   BlockMeta that says the block is in object storage);
2. a first subscription that re-sends state the CN already holds must not duplicate
   anything (a TN restart pushes its WAL's logtail again; a re-read from offset 0);
3. a reconnect must not reset the CN's watermark to zero (the broker goes away and
   comes back; a restarted CN starts from the checkpoint, not from nothing).
"""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from consumers.core.cn import CN
from consumers.core.table_state import TableState
from infra.config import KwalConfig
from infra.objectstore import FolderStore
from infra.processes import ServerProcess
from schemas.codec import decode_entry
from schemas.logtail import LogtailRecord, decode_logtail
from tests.conftest import unique
from tests.faults.broker import RestartableBroker
from tests.logtail.conftest import Tn, start_tn
from tn.logtail.engine_view import EngineCatalogView
from tn.logtail.publisher import LogtailPublisher


def _agree(cn: CN, tn: Tn, table: str, stamps: list[int]) -> None:
    for ts in stamps:
        if ts >= cn.horizon:
            expected = tn.engine.read("db", table, ts).to_pylist()
            assert cn.snapshot(f"db.{table}", ts).to_pylist() == expected, ts


def test_a_delete_committed_while_its_block_is_dumped_is_not_lost(
    tn: Tn, kwal_config: KwalConfig
) -> None:
    """A delete and an update of rows of a block commit after the checkpoint picked t1
    and while it dumps that block. The BlockMeta says rows and deletes up to t1 are in
    the object; the later delete stays in memory on the TN and on CNs, and lands in a
    delta object at the next checkpoint. A CN following live, one bootstrapping from
    the first checkpoint and one from the second all see the rows deleted."""
    tn.create("t")
    stamps = [tn.commit(lambda t: t.insert("db", "t", [{"id": i, "v": "v"} for i in range(100)]))]
    live = CN(kwal_config, ["db.t"], tn.store).start()  # no checkpoint yet: from offset 0
    during: list[int] = []

    def hook(step: str) -> None:
        if step == "dump_one" and not during:
            during.append(tn.commit(lambda t: t.delete("db", "t", [5, 6])))
            during.append(tn.commit(lambda t: t.update("db", "t", [{"id": 7, "v": "during"}])))

    tn.runner.hook = hook
    first = tn.checkpoint()
    tn.runner.hook = None
    assert len(during) == 2 and first.ts < during[0]  # after t1, before the BlockMeta
    stamps += [first.ts, *during, tn.commit(lambda t: t.insert("db", "t", [{"id": 200, "v": "after"}]))]
    late: list[CN] = []
    try:
        late.append(CN(kwal_config, ["db.t"], tn.store).start())
        second = tn.checkpoint()  # the delete is now in a delta object
        stamps.append(second.ts)
        late.append(CN(kwal_config, ["db.t"], tn.store).start())
        final = tn.engine.heartbeat().result(10)
        stamps.append(final)
        assert tn.logtail.publisher.flush(30), tn.logtail.publisher.errors
        assert [cn.horizon for cn in late] == [first.ts, second.ts]
        for cn in (live, *late):
            assert cn.wait_for(final, timeout_s=30), (cn.watermark(), cn.errors)
            rows = {r["id"]: r["v"] for r in cn.snapshot("db.t", final).to_pylist()}
            assert 5 not in rows and 6 not in rows and rows[7] == "during" and rows[200] == "after"
            assert len(rows) == 99
            _agree(cn, tn, "t", stamps)
            assert cn.errors == []
        tn_rows = tn.engine.read("db", "t", final).column("id").to_pylist()
        assert 5 not in tn_rows and 6 not in tn_rows and len(tn_rows) == 99
    finally:
        for cn in (live, *late):
            cn.close()


def _state(cn: CN, table: str) -> tuple[int, int, int, int]:
    """What a duplicate would grow: (changes applied, in-memory rows, deletes, blocks)."""
    with cn._lock:
        states: list[TableState] = cn.tables[table]
        return (
            sum(s.applied_changes for s in states),
            sum(b.num_rows for s in states for b in s.inserts),
            sum(len(s.deletes) for s in states),
            sum(len(s.blocks) for s in states),
        )


def _all_records(cfg: KwalConfig, topics: list[str]) -> list[LogtailRecord]:
    """Every record on `topics`, from their first offset to their end."""
    c = Consumer(cfg.kafka_client(**{"group.id": unique("resend-"), "enable.partition.eof": True}))
    c.assign([TopicPartition(t, 0, 0) for t in topics])
    out: list[LogtailRecord] = []
    at_end: set[str] = set()
    deadline = time.monotonic() + 30
    try:
        while len(at_end) < len(topics) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                at_end.add(m.topic() or "")
                continue
            out.append(decode_logtail(m.value() or b""))
    finally:
        c.close()
    assert len(at_end) == len(topics), "did not reach the end of the logtail topics"
    return out


def test_a_first_subscription_that_resends_state_creates_no_duplicates(
    tn: Tn, kwal_config: KwalConfig
) -> None:
    """Two CNs hold the table (one bootstrapped from a checkpoint, one that read from
    offset 0). Then (a) the TN pushes the logtail of every entry in its WAL again, as a
    restarted TN does, and (b) every record of the topics is applied again, as a first
    subscription re-sending state would. Nothing grows and both still agree."""
    tn.create("t")
    stamps = [tn.commit(lambda t: t.insert("db", "t", [{"id": i, "v": "a"} for i in range(50)]))]
    stamps.append(tn.commit(lambda t: t.delete("db", "t", [1, 2])))
    stamps.append(tn.checkpoint().ts)
    stamps.append(tn.commit(lambda t: t.insert("db", "t", [{"id": i, "v": "b"} for i in range(50, 80)])))
    stamps.append(tn.commit(lambda t: t.update("db", "t", [{"id": 3, "v": "u"}, {"id": 60, "v": "u"}])))
    stamps.append(tn.engine.heartbeat().result(10))
    assert tn.logtail.publisher.flush(30), tn.logtail.publisher.errors
    cns = [
        CN(kwal_config, ["db.t"], tn.store).start(),
        CN(kwal_config, ["db.t"], tn.store, bootstrap=False).start(),
    ]
    try:
        for cn in cns:
            assert cn.wait_for(stamps[-1], timeout_s=30), (cn.watermark(), cn.errors)
        assert cns[0].horizon == stamps[2] and cns[1].horizon == 0
        before = [_state(cn, "db.t") for cn in cns]
        # transactions applied: after the checkpoint 2 (insert, update); from offset 0, all 4
        assert [b[0] for b in before] == [2, 4]

        # (a) a restarted TN's push of its whole WAL again, then a heartbeat after it
        entries = [decode_entry(r.payload) for r in tn.engine.log.records()]
        assert len(entries) == 3  # truncated at the checkpoint: its FLUSH, the insert, the update
        again = LogtailPublisher(kwal_config, EngineCatalogView(tn.engine), ["db.t"])
        for entry in entries:
            again.on_commit(entry)
        again.start()
        assert again.flush(30), again.errors
        again.close()
        mark = tn.engine.heartbeat().result(10)
        stamps.append(mark)
        for cn in cns:
            assert cn.wait_for(mark, timeout_s=30), (cn.watermark(), cn.errors)
        # (b) the whole topics, applied again
        topics = [kwal_config.topics.catalog, kwal_config.topics.logtail("db", "t")]
        records = _all_records(kwal_config, topics)
        assert len(records) > len(entries)
        for cn in cns:
            cn.apply_many(records)
        assert [_state(cn, "db.t") for cn in cns] == before
        for cn in cns:
            _agree(cn, tn, "t", stamps)
            assert cn.errors == []
    finally:
        for cn in cns:
            cn.close()


def _settle(tn: Tn) -> int:
    """Two heartbeats by hand: the second reaches a table topic the first found busy
    (tn.logtail.publisher, step 3); returns its ts."""
    tn.engine.heartbeat().result(10)
    return tn.engine.heartbeat().result(10)


def test_a_reconnect_does_not_reset_the_watermark(
    s3_server: ServerProcess, kwal_config: KwalConfig, tmp_path: Path
) -> None:
    """The broker goes away with a CN following it and comes back on the same port:
    while it is away the CN's watermark stays where it was (reads at or below it still
    answer), afterwards it moves on from there; every watermark the CN reported is at
    least the one before it. A CN restarted after a checkpoint reports the checkpoint's
    ts first, never zero."""
    broker = RestartableBroker(s3_server)
    cfg = kwal_config.with_bootstrap(broker.address)
    cfg.topics.prefix = unique("kwal-")
    # heartbeats by hand: nothing is produced while the broker is away, so nothing
    # the embedded broker acknowledged can be lost in its restart
    tn = start_tn(cfg, FolderStore(tmp_path / "reconnect-objects"), heartbeats=False, physical=False)
    logtail, store = tn.logtail, tn.store
    marks: list[int] = []
    cn = CN(cfg, ["db.t"], store)  # no checkpoint yet: from offset 0
    cn.on_watermark = marks.append
    cn.start()
    restarted: CN | None = None
    try:
        tn.create("t")
        stamps = [tn.commit(lambda t: t.insert("db", "t", [{"id": i, "v": "x"} for i in range(20)]))]
        stamps.append(_settle(tn))
        assert logtail.publisher.flush(30), logtail.publisher.errors
        assert cn.wait_for(stamps[-1], timeout_s=30), (cn.watermark(), cn.errors)
        time.sleep(0.5)
        broker.stop()
        time.sleep(2)  # the CN's fetches fail meanwhile
        assert cn.watermark() == stamps[-1]
        assert cn.snapshot("db.t", stamps[-1]).num_rows == 20
        broker.restart()
        stamps.append(tn.commit(lambda t: t.delete("db", "t", [0, 1])))
        stamps.append(tn.checkpoint().ts)
        stamps.append(tn.commit(lambda t: t.insert("db", "t", [{"id": 100, "v": "back"}])))
        stamps.append(_settle(tn))
        assert logtail.publisher.flush(60), logtail.publisher.errors
        assert cn.wait_for(stamps[-1], timeout_s=60), (cn.watermark(), cn.errors)
        assert marks == sorted(marks) and marks[-1] >= stamps[-1]
        _agree(cn, tn, "t", stamps)

        restarted_marks: list[int] = []
        restarted = CN(cfg, ["db.t"], store)
        restarted.on_watermark = restarted_marks.append
        restarted.start()
        assert restarted.wait_for(stamps[-1], timeout_s=30), (restarted.watermark(), restarted.errors)
        assert restarted_marks[0] == stamps[3] and restarted_marks == sorted(restarted_marks)
        _agree(restarted, tn, "t", stamps)
    finally:
        cn.close()
        if restarted is not None:
            restarted.close()
        tn.close()
        broker.stop()
