"""FileDriver: the driver contract, group commit, segments, truncation, close."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tn.logstore.driver import LogClosedError, LogStore, LogStoreError
from tn.logstore.file_backend import FileDriver
from tn.logstore.file_backend import driver as driver_module
from tn.logstore.file_backend.segments import (
    TRUNCATION_FILE,
    segment_name,
    write_truncation_point,
)

from .helpers import payload, write_segment


def _fill(driver: FileDriver, n: int, size: int = 300) -> None:
    store = LogStore(driver)
    futures = [store.append(payload(store.next_lsn(), size)) for _ in range(n)]
    futures[-1].result(timeout=30)


def _lsns(driver: FileDriver, from_lsn: int | None = None) -> list[int]:
    return [r.lsn for r in LogStore(driver).records(from_lsn, max_bytes=10_000)]


def test_append_read_reopen(tmp_path: Path) -> None:
    driver = FileDriver(tmp_path, segment_bytes=32 << 10)
    store = LogStore(driver)
    sizes = [0, 1, 100, 40_000, 7, 100_000, 5]
    futures = [store.append(payload(i + 1, n)) for i, n in enumerate(sizes)]
    assert [f.result(timeout=10) for f in futures] == list(range(1, 8))
    driver.close()
    driver = FileDriver(tmp_path)
    assert driver.last_lsn() == 7
    got = list(LogStore(driver).records())
    assert [(r.lsn, r.payload) for r in got] == [
        (i + 1, payload(i + 1, n)) for i, n in enumerate(sizes)
    ]
    driver.close()


def test_read_batches_by_max_bytes_and_from_any_lsn(tmp_path: Path) -> None:
    driver = FileDriver(tmp_path, segment_bytes=100 << 10)
    _fill(driver, 3000, 200)
    assert len(driver.segment_paths()) > 3
    batch, nxt = driver.read(1, 1000)
    assert [r.lsn for r in batch] == [1, 2, 3, 4, 5] and nxt == 6
    batch, nxt = driver.read(2500, 0)  # at least one entry, even over max_bytes
    assert [r.lsn for r in batch] == [2500] and nxt == 2501
    for start in (1, 499, 500, 501, 1234, 2999, 3000):
        batch, _ = driver.read(start, 1)
        assert batch[0].lsn == start and batch[0].payload == payload(start, 200)
    assert driver.read(3001, 1000) == ([], 3001)
    assert _lsns(driver) == list(range(1, 3001))
    driver.close()


def test_segments_roll_and_are_named_by_first_lsn(tmp_path: Path) -> None:
    driver = FileDriver(tmp_path, segment_bytes=64 << 10)
    _fill(driver, 1000, 500)
    driver.close()
    driver = FileDriver(tmp_path)
    names = [p.name for p in driver.segment_paths()]
    firsts = [s.first_lsn for s in driver.recovery.segments]
    assert names == [segment_name(f) for f in firsts]
    assert firsts[0] == 1 and len(firsts) > 5
    assert all(p.stat().st_size < (64 << 10) + 2000 for p in driver.segment_paths())
    driver.close()


def test_reopen_appends_to_the_newest_segment(tmp_path: Path) -> None:
    driver = FileDriver(tmp_path)
    _fill(driver, 10)
    driver.close()
    driver = FileDriver(tmp_path)
    _fill(driver, 10)
    driver.close()
    assert [p.name for p in tmp_path.glob("*.log")] == [segment_name(1)]
    driver = FileDriver(tmp_path, recovery_mode="absolute-consistency")
    assert _lsns(driver) == list(range(1, 21))
    driver.close()


def test_group_commit_one_fsync_per_group_futures_in_order(tmp_path: Path) -> None:
    driver = FileDriver(tmp_path, group_max_entries=64)
    store = LogStore(driver)
    done: list[int] = []
    lock = threading.Lock()

    def on_done(f: object) -> None:
        with lock:
            done.append(f.result())  # type: ignore[attr-defined]

    def worker() -> None:
        for _ in range(200):
            fut = store.append(b"x" * 50)
            fut.add_done_callback(on_done)
            fut.result(timeout=30)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    driver.close()
    assert done == list(range(1, 3201))  # completed in LSN order
    assert driver.fsyncs < 3200  # grouped
    assert driver.fsyncs >= 3200 // 64


def test_close_flushes_queue_then_rejects(tmp_path: Path) -> None:
    driver = FileDriver(tmp_path)
    store = LogStore(driver)
    futures = [store.append(b"y" * 10) for _ in range(500)]
    driver.close()
    assert all(f.result(timeout=0) for f in futures)  # close completed every queued future
    late = driver.append(501, b"late")
    with pytest.raises(LogClosedError):
        late.result(timeout=1)
    driver.close()  # idempotent
    driver = FileDriver(tmp_path)
    assert driver.last_lsn() == 500
    driver.close()


def test_append_out_of_order_is_refused(tmp_path: Path) -> None:
    driver = FileDriver(tmp_path)
    with pytest.raises(ValueError, match="expected 1"):
        driver.append(2, b"x")
    driver.close()


def test_write_failure_fails_the_group_and_later_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = FileDriver(tmp_path)
    assert driver.append(1, b"ok").result(timeout=10) == 1

    def broken(fd: int) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(driver_module, "sync_data", broken)
    with pytest.raises(LogStoreError, match="I/O error"):
        driver.append(2, b"lost").result(timeout=10)
    with pytest.raises(LogStoreError, match="failed"):
        driver.append(3, b"refused").result(timeout=10)
    driver.close()


# -- truncation -----------------------------------------------------------------


def test_truncate_deletes_whole_segments_below_the_point(tmp_path: Path) -> None:
    driver = FileDriver(tmp_path, segment_bytes=16 << 10)
    _fill(driver, 400, 500)
    before = driver.recovery.segments  # the live list
    firsts = [s.first_lsn for s in before]
    assert len(firsts) > 5
    point = firsts[3] + 2  # inside the 4th segment
    driver.truncate(point)
    remaining = [s.first_lsn for s in driver.recovery.segments]
    assert remaining[0] == firsts[3]  # the segment holding point+1 is kept
    assert not (tmp_path / segment_name(firsts[2])).exists()
    assert driver.truncated() == point
    assert _lsns(driver) == list(range(point + 1, 401))
    assert driver.read(1, 1 << 20)[0][0].lsn == point + 1  # never <= point
    assert driver.read(point, 1 << 20)[0][0].lsn == point + 1
    driver.truncate(point - 5)  # going back is a no-op
    assert driver.truncated() == point
    driver.close()
    driver = FileDriver(tmp_path)
    assert driver.truncated() == point  # survives reopen
    assert driver.last_lsn() == 400
    assert _lsns(driver, 1) == list(range(point + 1, 401))
    _fill(driver, 5)
    assert _lsns(driver)[-1] == 405
    driver.close()


def test_truncate_everything_keeps_lsns_going(tmp_path: Path) -> None:
    driver = FileDriver(tmp_path, segment_bytes=4 << 10)
    _fill(driver, 100, 500)
    driver.truncate(100)
    assert driver.read(1, 1 << 20) == ([], 101)
    assert len(driver.segment_paths()) == 1  # the active one stays
    driver.close()
    driver = FileDriver(tmp_path)
    assert (driver.truncated(), driver.last_lsn()) == (100, 100)
    assert LogStore(driver).append(b"z").result(timeout=10) == 101
    assert _lsns(driver) == [101]
    driver.close()


def test_truncate_past_durable_is_refused(tmp_path: Path) -> None:
    driver = FileDriver(tmp_path)
    _fill(driver, 3)
    with pytest.raises(ValueError, match="durable"):
        driver.truncate(4)
    driver.close()


def test_point_written_but_segments_not_yet_deleted(tmp_path: Path) -> None:
    """A crash between steps 3 and 4 of the truncation protocol: reopen deletes."""
    driver = FileDriver(tmp_path, segment_bytes=8 << 10)
    _fill(driver, 200, 500)
    firsts = [s.first_lsn for s in driver.recovery.segments]
    driver.close()
    write_truncation_point(tmp_path, firsts[4])
    assert (tmp_path / TRUNCATION_FILE).exists()
    driver = FileDriver(tmp_path, recovery_mode="absolute-consistency")
    assert [s.first_lsn for s in driver.recovery.segments][0] == firsts[4]
    assert _lsns(driver) == list(range(firsts[4] + 1, 201))
    driver.close()


def test_reads_while_appending_see_only_durable_entries(tmp_path: Path) -> None:
    driver = FileDriver(tmp_path, segment_bytes=32 << 10)
    store = LogStore(driver)
    stop = threading.Event()
    errors: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            got = _lsns(driver)
            if got != list(range(1, len(got) + 1)) or (got and got[-1] > driver.durable_lsn()):
                errors.append(f"bad read {got[:3]}..{got[-3:]}")

    t = threading.Thread(target=reader)
    t.start()
    for _ in range(20):
        futures = [store.append(payload(store.next_lsn(), 700)) for _ in range(50)]
        futures[-1].result(timeout=10)
    stop.set()
    t.join()
    driver.close()
    assert errors == []


def test_truncation_point_above_the_recovered_tail(tmp_path: Path) -> None:
    """The point is past the last entry recovered (the tail after it was lost):
    the log goes on at point + 1, and the gap below the point is no damage."""
    write_segment(tmp_path, [(i, payload(i, 10)) for i in range(1, 11)])
    write_truncation_point(tmp_path, 12)
    driver = FileDriver(tmp_path)
    assert (driver.last_lsn(), driver.read(1, 100)) == (12, ([], 13))
    assert LogStore(driver).append(b"13").result(timeout=10) == 13
    driver.close()
    driver = FileDriver(tmp_path, recovery_mode="absolute-consistency")
    assert [(r.lsn, r.payload) for r in LogStore(driver).records()] == [(13, b"13")]
    assert driver.segment_paths() == [tmp_path / segment_name(13)]
    driver.close()


@pytest.mark.parametrize("prealloc", [0, 1 << 16])
def test_preallocated_zeros_are_the_clean_end(tmp_path: Path, prealloc: int) -> None:
    driver = FileDriver(tmp_path, preallocate_bytes=prealloc)
    _fill(driver, 50, 100)
    valid = driver.recovery.segments[-1].size
    path = driver.segment_paths()[-1]
    assert path.stat().st_size == valid + prealloc
    driver.close()
    driver = FileDriver(tmp_path, recovery_mode="absolute-consistency", preallocate_bytes=prealloc)
    assert driver.recovery.cut is None and driver.recovery.skipped == []
    assert _lsns(driver) == list(range(1, 51))
    _fill(driver, 50, 100)
    driver.close()
    driver = FileDriver(tmp_path, recovery_mode="absolute-consistency")
    assert _lsns(driver) == list(range(1, 101))
    driver.close()


def test_a_cancelled_future_does_not_stop_the_writer(tmp_path: Path) -> None:
    driver = FileDriver(tmp_path)
    store = LogStore(driver)
    futures = [store.append(b"c") for _ in range(200)]
    cancelled = [f for f in futures[::7] if f.cancel()]
    assert store.append(b"last").result(timeout=10) == 201
    assert all(f.result(timeout=0) for f in futures if f not in cancelled)
    driver.close()
    driver = FileDriver(tmp_path)
    assert _lsns(driver) == list(range(1, 202))  # cancelled entries were written anyway
    driver.close()


def test_closed_loop_appenders_complete_only_after_their_sync_and_in_order(tmp_path: Path) -> None:
    """32 clients, each appending its next entry from the callback of its last one (the
    loop that makes the writer split a group's completion, module docstring step 2): every
    callback sees its entry already durable, and callbacks run in LSN order."""
    driver = FileDriver(tmp_path)
    store = LogStore(driver)
    seen: list[int] = []
    not_durable: list[int] = []
    remaining = [3000]
    lock = threading.Lock()
    finished = threading.Event()

    def on_done(f: object) -> None:
        lsn = f.result()  # type: ignore[attr-defined]
        if driver.durable_lsn() < lsn:
            not_durable.append(lsn)
        seen.append(lsn)
        with lock:
            remaining[0] -= 1
            more = remaining[0] >= 32
            if remaining[0] == 0:
                finished.set()
        if more:
            store.append(b"z" * 100).add_done_callback(on_done)

    for _ in range(32):
        store.append(b"z" * 100).add_done_callback(on_done)
    assert finished.wait(60)
    driver.close()
    assert not_durable == []
    assert seen == list(range(1, 3001))
    assert driver.fsyncs < 3000  # grouped


def test_write_failure_still_completes_the_group_synced_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 7: entry 1 is synced, entries 2-3 are taken next and their write fails:
    1 completes with its LSN (it is durable), 2 and 3 fail."""
    driver = FileDriver(tmp_path)
    first_sync = threading.Event()
    release = threading.Event()
    real_sync = driver_module.sync_data
    real_write = driver_module._pwrite_all
    writes = [0]

    def slow_sync(fd: int) -> None:
        real_sync(fd)
        if not first_sync.is_set():
            first_sync.set()
            assert release.wait(10)

    def failing_write(fd: int, data: bytes | bytearray, offset: int) -> None:
        writes[0] += 1
        if writes[0] > 1 and data.count(0) != len(data):  # the second group's records
            raise OSError(28, "No space left on device")
        real_write(fd, data, offset)

    monkeypatch.setattr(driver_module, "sync_data", slow_sync)
    monkeypatch.setattr(driver_module, "_pwrite_all", failing_write)
    f1 = driver.append(1, b"one")
    assert first_sync.wait(10)  # 1 is written and its sync has returned
    f2 = driver.append(2, b"two")
    f3 = driver.append(3, b"three")
    release.set()
    assert f1.result(timeout=10) == 1
    for f in (f2, f3):
        with pytest.raises(LogStoreError, match="No space left"):
            f.result(timeout=10)
    driver.close()
    reopened = FileDriver(tmp_path)
    assert reopened.last_lsn() == 1
    reopened.close()
