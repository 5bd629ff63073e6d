"""AckFuture: a Future in every respect the log drivers' users rely on."""

from __future__ import annotations

import functools
import threading
from concurrent.futures import (
    FIRST_COMPLETED,
    CancelledError,
    Future,
    InvalidStateError,
    as_completed,
    wait,
)

import pytest

from tn.logstore.ack_future import AckFuture, set_results


def test_result_and_exception_reach_a_thread_blocked_on_them() -> None:
    ok: AckFuture[int] = AckFuture()
    bad: AckFuture[int] = AckFuture()
    threading.Timer(0.05, ok.set_result, (7,)).start()
    threading.Timer(0.05, bad.set_exception, (ValueError("boom"),)).start()
    assert ok.result(timeout=5) == 7
    assert isinstance(bad.exception(timeout=5), ValueError)
    with pytest.raises(ValueError, match="boom"):
        bad.result(timeout=0)


def test_a_timeout_raises_and_leaves_it_pending() -> None:
    f: AckFuture[int] = AckFuture()
    with pytest.raises(TimeoutError):
        f.result(timeout=0.01)
    assert not f.done()
    f.set_result(1)
    assert f.done() and f.result() == 1


def test_callbacks_run_once_in_order_also_when_added_after_completion() -> None:
    f: AckFuture[int] = AckFuture()
    calls: list[str] = []
    f.add_done_callback(lambda _: calls.append("a"))
    f.add_done_callback(lambda _: calls.append("b"))
    f.set_result(1)
    f.add_done_callback(lambda _: calls.append("late"))
    assert calls == ["a", "b", "late"]


def test_completing_twice_or_after_cancel_is_refused() -> None:
    f: AckFuture[int] = AckFuture()
    f.set_result(1)
    with pytest.raises(InvalidStateError):
        f.set_result(2)
    with pytest.raises(InvalidStateError):
        f.set_exception(ValueError())
    g: AckFuture[int] = AckFuture()
    assert g.cancel() and g.cancelled() and g.done()
    with pytest.raises(CancelledError):
        g.result()
    with pytest.raises(InvalidStateError):
        g.set_result(1)


def test_wait_and_as_completed_work_on_it() -> None:
    fs: list[AckFuture[int]] = [AckFuture() for _ in range(3)]
    threading.Timer(0.05, fs[1].set_result, (1,)).start()
    done, not_done = wait(fs, timeout=5, return_when=FIRST_COMPLETED)
    assert done == {fs[1]} and len(not_done) == 2
    fs[0].set_result(0)
    fs[2].set_exception(KeyError("k"))
    assert sorted(f.exception() is None for f in as_completed(fs, timeout=5)) == [
        False,
        True,
        True,
    ]


def test_set_results_completes_in_order_and_skips_a_cancelled_one() -> None:
    fs: list[Future[int]] = [AckFuture(), AckFuture(), Future(), AckFuture()]
    order: list[int] = []
    for i, f in enumerate(fs):
        f.add_done_callback(functools.partial(lambda i, _: order.append(i), i))
    assert fs[3].cancel()  # its callback runs now, at cancel
    set_results([(f, 10 + i) for i, f in enumerate(fs)])
    assert order == [3, 0, 1, 2]
    assert [f.result() for f in fs[:3]] == [10, 11, 12]
    assert fs[3].cancelled()


def test_a_raising_callback_does_not_stop_the_others() -> None:
    fs: list[Future[int]] = [AckFuture(), AckFuture()]
    seen: list[int] = []

    def bad(_: object) -> None:
        raise RuntimeError("callback bug")

    fs[0].add_done_callback(bad)
    fs[1].add_done_callback(lambda f: seen.append(f.result()))
    set_results([(fs[0], 1), (fs[1], 2)])
    assert seen == [2] and fs[0].result() == 1


def test_it_sets_every_attribute_a_future_has() -> None:
    """AckFuture skips Future.__init__; a Python whose Future gains an attribute must fail
    here rather than in an inherited method."""
    assert set(vars(Future())) == set(vars(AckFuture())) | {"_condition"}
