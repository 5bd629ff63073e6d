"""The Kafka log backend on a real broker (embedded tansu, or KWAL_TEST_BOOTSTRAP)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from infra.config import KwalConfig
from tests.delivery import NoOffset
from tests.logstore_kafka.conftest import RawWal
from tn.logstore.driver import LogStore
from tn.logstore.kafka_backend import (
    AppendFailedError,
    FencedError,
    KafkaDriver,
    RetentionUnsafeError,
    WindowTimeoutError,
)
from tn.logstore.kafka_backend.headers import decode_headers
from tn.logstore.kafka_backend.kio import read_until
from tn.logstore.kafka_backend.writer import GroupWriter


def _all(driver: KafkaDriver) -> dict[int, bytes]:
    return {r.lsn: r.payload for r in LogStore(driver).records()}


@pytest.mark.tansu
def test_out_of_order_across_partitions_completes_in_lsn_order(wal_config: KwalConfig) -> None:
    """Records land on 4 partitions, several in flight, and become durable out of LSN order;
    futures still complete in LSN order: whenever LSN n is done, every LSN below it is done."""
    wal_config.topics.wal_partitions = 4
    wal_config.wal.group_max_entries = 4
    d = KafkaDriver(wal_config, delete_records=False, max_in_flight=8)
    futures: dict[int, Future[int]] = {}
    violations: list[tuple[int, int]] = []
    stop = threading.Event()

    def monitor() -> None:
        # Scan from the highest LSN down: a done future seen first must have all below it
        # done too, as they completed before it (a scan upwards could race a completion).
        while not stop.is_set():
            with lock:  # the appenders add to `futures` under it
                snapshot = sorted(futures.items(), reverse=True)
            seen_done: int | None = None
            for lsn, fut in snapshot:
                if fut.done():
                    seen_done = seen_done or lsn
                elif seen_done is not None:
                    violations.append((lsn, seen_done))
            time.sleep(0.001)

    lock = threading.Lock()
    try:
        assert d.partitions == [0, 1, 2, 3]
        store = LogStore(d)
        watcher = threading.Thread(target=monitor)
        watcher.start()

        def appender(k: int) -> None:
            for i in range(150):
                with lock:
                    fut = store.append(f"{k}:{i}".encode())
                    futures[fut_lsn(fut, d)] = fut

        threads = [threading.Thread(target=appender, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [futures[n].result(20) for n in range(1, 1201)] == list(range(1, 1201))
        stop.set()
        watcher.join()
        assert violations == []
        # records did land on every partition (delivery order is the broker's; the Window
        # unit test forces out-of-order durability deterministically)
        infos = [i for i in d.records_map() if i.max_lsn]
        assert {i.partition for i in infos} == {0, 1, 2, 3}
        swaps = sum(a.max_lsn > b.max_lsn for a, b in zip(infos, infos[1:], strict=False))
        print(f"records durable out of LSN order: {swaps} of {len(infos)}")
        assert sum(s.last - s.first + 1 for s in d._writer.segments) == 1200
    finally:
        stop.set()
        d.close()
    d2 = KafkaDriver(wal_config, delete_records=False)
    try:
        assert d2.last_lsn() == 1200
        got = _all(d2)
        assert sorted(got) == list(range(1, 1201))
    finally:
        d2.close()


def fut_lsn(_fut: Future[int], driver: KafkaDriver) -> int:
    """The LSN just appended (called under the test's append lock)."""
    return driver.last_lsn()


def test_window_blocks_and_unblocks(wal_config: KwalConfig) -> None:
    wal_config.wal.window = 4
    wal_config.wal.append_timeout_s = 3.0
    d = KafkaDriver(wal_config, delete_records=False)
    try:
        store = LogStore(d)
        store.append(b"warm").result(10)
        d._pump.pause()  # hold every acknowledgement
        # seed 004: with LSN 2 the oldest unacknowledged and a window of 4, LSNs >= 6 wait
        futs = [store.append(b"x%d" % i) for i in range(4)]  # LSNs 2..5
        assert d.last_lsn() == 5
        box: list[object] = []
        blocked = threading.Thread(target=lambda: box.append(store.append(b"blocked")))
        blocked.start()
        time.sleep(0.5)
        assert blocked.is_alive() and not box  # LSN 6 waits
        t0 = time.monotonic()
        d._pump.resume()
        blocked.join(5)
        assert not blocked.is_alive() and time.monotonic() - t0 < 3
        assert [f.result(10) for f in futs] == [2, 3, 4, 5]
        # a window that never opens ends in a clear, bounded error (LSN not consumed)
        store.append(b"y").result(10)
        d._pump.pause()
        for _ in range(4):
            store.append(b"z")
        with pytest.raises(WindowTimeoutError, match="window"):
            store.append(b"too far")
        d._pump.resume()
    finally:
        d.close()


@pytest.mark.tansu
def test_seed_004_worked_example(wal_config: KwalConfig, raw_wal: RawWal) -> None:
    """Truncation to 7 stored at backend position 11; positions 5, 6, 7, 10 hold LSNs > 7."""
    layout = {
        1: 1,
        2: 2,
        3: 3,
        4: 4,
        5: 8,
        6: 15,
        7: 9,
        8: 5,
        9: 6,
        10: 10,
        11: 7,
        12: 11,
        13: 12,
        14: 14,
    }
    raw_wal.epoch(1, 0)
    for _position, lsn in sorted(layout.items()):  # backend positions 1..14 in order
        raw_wal.entries(0, 1, lsn, [b"old%d" % lsn], acked=min(7, lsn - 1))
    raw_wal.meta("truncated", {"lsn": 7})
    d = KafkaDriver(wal_config, delete_records=False)
    try:
        r = d.replay_result
        assert d.epoch == 2 and d.truncated() == 7
        assert r.head_skipped == 7  # positions 1-4 and 8, 9, 11
        assert r.tail_dropped == [14, 15]  # positions 14 and 6
        assert d.last_lsn() == 12
        assert _all(d) == {n: b"old%d" % n for n in range(8, 13)}
        # only the prefix through position 4 (offsets 0-3) is physically truncatable
        assert d.physical_truncation_plan(d.records_map(), 7) == {0: 4}
        store = LogStore(d)
        assert store.append(b"new13").result(10) == 13
        assert store.append(b"new14").result(10) == 14
    finally:
        d.close()
    d2 = KafkaDriver(wal_config, delete_records=False)
    try:
        got = _all(d2)
        assert got == {**{n: b"old%d" % n for n in range(8, 13)}, 13: b"new13", 14: b"new14"}
        assert d2.replay_result.zombies_ignored == 2  # old 14, 15 above base(2) = 12
    finally:
        d2.close()


@pytest.mark.tansu
def test_logical_truncation_survives_restart(wal_config: KwalConfig) -> None:
    d = KafkaDriver(wal_config, delete_records=False)
    try:
        store = LogStore(d)
        futs = [store.append(b"p%d" % i) for i in range(1, 51)]
        assert futs[-1].result(10) == 50
        with pytest.raises(ValueError):
            d.truncate(51)
        d.truncate(20)
        assert d.truncated() == 20 and d.truncation_mode == "logical"
        # the note names the caller's choice, not the broker (which may well delete)
        assert "logical only" in d.truncation_note and "delete_records=False" in d.truncation_note
        assert "lacks" not in d.truncation_note
        assert min(_all(d)) == 21
        d.truncate(10)  # never moves back
        assert d.truncated() == 20
    finally:
        d.close()
    d2 = KafkaDriver(wal_config, delete_records=False)
    try:
        assert d2.truncated() == 20
        assert _all(d2) == {n: b"p%d" % n for n in range(21, 51)}
        # read from the offset the truncation record names (the first record holding an
        # entry above 20), not from 0: only that record's entries <= 20 are skipped
        start = d2.replay_start[0]
        assert start > 0
        held = [
            decode_headers(m.headers())
            for m in read_until(wal_config.kafka_client(), wal_config.topics.wal, {0: start + 1}, 10)
            if m.offset() == start
        ]
        assert len(held) == 1 and held[0].last > 20
        assert d2.replay_result.head_skipped == max(0, 20 - held[0].first + 1)
    finally:
        d2.close()


def test_physical_truncation_where_broker_deletes_records(wal_config: KwalConfig) -> None:
    from infra.capabilities import probe

    feature = probe(wal_config).delete_records
    if not feature.works:
        pytest.skip(f"broker lacks DeleteRecords (kwal doctor: {feature.status} {feature.detail})")
    d = KafkaDriver(wal_config, delete_records=True)
    try:
        store = LogStore(d)
        for i in range(1, 31):
            store.append(b"q%d" % i).result(10)
        d.truncate(15)
        assert d.truncation_mode == "physical"
    finally:
        d.close()
    d2 = KafkaDriver(wal_config, delete_records=True)
    try:
        assert _all(d2) == {n: b"q%d" % n for n in range(16, 31)}
        assert d2.replay_result.head_skipped == 0  # physically gone
    finally:
        d2.close()


@pytest.mark.tansu
def test_two_writers_older_is_fenced(wal_config: KwalConfig) -> None:
    a = KafkaDriver(wal_config, delete_records=False, writer_id="writer-a")
    b: KafkaDriver | None = None
    try:
        sa = LogStore(a)
        for i in range(1, 11):
            sa.append(b"a%d" % i)
        assert sa.append(b"a11").result(10) == 11
        b = KafkaDriver(wal_config, delete_records=False, writer_id="writer-b")
        assert b.epoch == a.epoch + 1 and b.last_lsn() == 11
        # the zombie keeps writing right after b's marker, before it learns it is fenced
        late = [sa.append(b"zombie%d" % i) for i in range(5)]
        deadline = time.monotonic() + 5
        while a.failure() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert isinstance(a.failure(), FencedError)
        with pytest.raises(FencedError):
            sa.append(b"after fence").result(5)
        sb = LogStore(b)
        for i in range(12, 21):
            sb.append(b"b%d" % i)
        assert sb.append(b"b21").result(10) == 21
        for f in late:
            f.exception(
                10
            )  # every late append completes (acked before the fence was seen, or failed)
    finally:
        a.close()
        if b is not None:
            b.close()
    c = KafkaDriver(wal_config, delete_records=False)
    try:
        got = _all(c)
        assert sorted(got) == list(range(1, 22))
        assert all(not p.startswith(b"zombie") for p in got.values())
        assert got[12] == b"b12" and got[11] == b"a11"
    finally:
        c.close()


def test_lost_broker_fails_pending_appends_in_bounded_time(
    wal_config: KwalConfig, tmp_path: Path
) -> None:
    from infra.brokers.local import start_local_broker
    from tests.conftest import TEST_BROKER

    broker = start_local_broker(TEST_BROKER, tmp_path / "broker")
    try:
        cfg = wal_config.with_bootstrap(broker.address)
        cfg.wal.append_timeout_s = 2.0
        d = KafkaDriver(cfg, delete_records=False)
        store = LogStore(d)
        assert store.append(b"ok").result(10) == 1
        broker.kill()
        t0 = time.monotonic()
        futs = [store.append(b"lost%d" % i) for i in range(5)]
        for f in futs:
            with pytest.raises(AppendFailedError):
                f.result(10)
        assert time.monotonic() - t0 < 6
        with pytest.raises(AppendFailedError):
            store.append(b"after").result(1)
        t1 = time.monotonic()
        d.close()
        assert time.monotonic() - t1 < 10
    finally:
        broker.stop()


def test_fatal_producer_error_fails_the_writer_and_a_reopen_goes_on(
    wal_config: KwalConfig,
) -> None:
    """librdkafka declared the idempotent producer fatal in a broker-restart run
    (OUT_OF_ORDER_SEQUENCE_NUMBER, raised from poll on the pump thread). Injected here
    where the pump meets it: pending and later appends fail with an error that says so,
    and a reopened driver (new epoch, new producer) has every acknowledged entry and
    takes appends again."""
    from confluent_kafka import KafkaError, KafkaException

    d = KafkaDriver(wal_config, delete_records=False)
    store = LogStore(d)
    try:
        assert [store.append(b"a%d" % i).result(10) for i in range(3)] == [1, 2, 3]
        err = KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "desync", fatal=True)
        d._pump._poll_failed(KafkaException(err))  # what Pump._run does when poll raises it
        with pytest.raises(AppendFailedError, match="fatal error.*reopen the log"):
            store.append(b"after").result(5)
        assert isinstance(d.failure(), AppendFailedError)
    finally:
        d.close()
    d2 = KafkaDriver(wal_config, delete_records=False)
    try:
        assert d2.epoch == d.epoch + 1
        got = _all(d2)
        assert [got[n] for n in (1, 2, 3)] == [b"a0", b"a1", b"a2"]
        assert LogStore(d2).append(b"again").result(10) == d2.last_lsn()
    finally:
        d2.close()


def _wal_topic_with(cfg: KwalConfig, config: dict[str, str]) -> None:
    from infra.topics import TopicSpec, ensure_topics

    ensure_topics(
        cfg,
        [
            TopicSpec(cfg.topics.wal, 1, {"cleanup.policy": "delete", **config}),
            TopicSpec(cfg.topics.wal_meta, 1, {"cleanup.policy": "compact"}),
        ],
    )


def test_retention_guard_refuses_unsafe_retention(wal_config: KwalConfig) -> None:
    # retention.bytes below the bytes above the truncation point (a broker that deletes
    # never removes a partition's only segment by size, so the entry stays to be seen;
    # a short retention.ms would have it deleted before the driver could refuse)
    _wal_topic_with(wal_config, {"retention.ms": "-1", "retention.bytes": "8"})
    raw = RawWal(wal_config)
    _wal_topic_with(wal_config, {})  # creates the meta topic beside it (the WAL exists)
    raw.epoch(1, 0)
    raw.entries(0, 1, 1, [b"needed entry"], acked=0)
    with pytest.raises(RetentionUnsafeError) as e:
        KafkaDriver(wal_config, delete_records=False)
    assert e.value.setting == "retention.bytes"
    # policy "warn": opens, says so loudly, and keeps the warning for ops status
    wal_config.wal.retention_floor_check_s = 0  # no keeper raising it meanwhile
    d = KafkaDriver(wal_config, delete_records=False, retention_policy="warn")
    try:
        assert "retention.bytes=8" in d.retention_warning
        assert d.status()["retention_warning"]
    finally:
        d.close()


def test_retention_guard_warns_on_finite_but_safe_retention(wal_config: KwalConfig) -> None:
    _wal_topic_with(
        wal_config, {"retention.ms": str(7 * 24 * 3600 * 1000), "retention.bytes": "-1"}
    )
    d = KafkaDriver(wal_config, delete_records=False)
    try:
        assert "finite retention.ms" in d.retention_warning
        assert d.status()["truncation_mode"] == "logical"
    finally:
        d.close()


def test_truncate_asks_delete_records_only_for_the_safe_prefix(wal_config: KwalConfig) -> None:
    """The DeleteRecords request itself is stubbed (the embedded broker drops the connection
    on it); what is checked is which offsets the driver asks for, per partition."""
    from concurrent.futures import Future as CFuture

    from confluent_kafka import TopicPartition

    wal_config.topics.wal_partitions = 2
    d = KafkaDriver(wal_config, delete_records=True)
    asked: list[list[tuple[int, int]]] = []

    class StubAdmin:
        def delete_records(self, tps: list[TopicPartition], **_: object) -> dict[object, object]:
            asked.append(sorted((tp.partition, tp.offset) for tp in tps))
            out: dict[object, object] = {}
            for tp in tps:
                f: CFuture[object] = CFuture()
                f.set_result(None)
                out[tp] = f
            return out

    try:
        store = LogStore(d)
        for i in range(1, 21):
            store.append(b"s%d" % i).result(10)  # one entry per record, round-robin
        real_admin, d._admin = d._admin, StubAdmin()  # type: ignore[assignment]
        infos = d.records_map()
        d.truncate(9)
        expected = d.physical_truncation_plan(infos, 9)
        assert asked == [sorted(expected.items())]
        for p, before in expected.items():  # everything before is <= 9, the record at it is > 9
            rows = sorted((i for i in infos if i.partition == p), key=lambda i: i.offset)
            assert all(i.max_lsn <= 9 for i in rows if i.offset < before)
            assert any(i.offset == before and i.max_lsn > 9 for i in rows)
        d.truncate(9)  # idempotent: nothing more to ask
        assert len(asked) == 1
        assert d.truncation_mode == "physical"
        d._admin = real_admin
    finally:
        d.close()


def test_delivery_without_offset_is_issued_again_before_acknowledging(
    wal_config: KwalConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded broker, restarted, answered "duplicate sequence" for a record it had not
    kept (the broker-restart fault test lost LSN 54 so). Such a report must not acknowledge:
    the entries are issued again and acknowledged by the new record's delivery."""
    real = GroupWriter._delivered
    hidden: list[int] = []

    def delivered(self: GroupWriter, err: Any, msg: Any, issue: Any, size: int) -> None:
        if err is None and issue[0] == 2 and not hidden:  # the first record holding LSN 2
            hidden.append(int(msg.offset()))
            msg = NoOffset(msg)
        real(self, err, msg, issue, size)

    monkeypatch.setattr(GroupWriter, "_delivered", delivered)
    d = KafkaDriver(wal_config, delete_records=False)
    try:
        store = LogStore(d)
        assert [store.append(b"e%d" % i).result(10) for i in range(1, 4)] == [1, 2, 3]
        assert d._writer.reissued == 1 and len(hidden) == 1
        # the map names the copy, never the unproven record
        seg = d._segment_for(2)
        assert seg is not None and seg.offset != hidden[0]
        assert d.read(2, 1 << 20)[0][0].payload == b"e2"  # read back at the copy's offset
    finally:
        d.close()
    d2 = KafkaDriver(wal_config, delete_records=False)
    try:
        assert _all(d2) == {1: b"e1", 2: b"e2", 3: b"e3"}  # the two copies of LSN 2 are one
    finally:
        d2.close()
