"""`infra.queues.drain`: take what a queue holds without blocking."""

from __future__ import annotations

import queue

from infra.queues import drain


def test_drain_takes_everything_including_items_put_meanwhile() -> None:
    q: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(3):
        q.put(i)
    seen = []
    for item in drain(q):
        seen.append(item)
        if item == 1:
            q.put(9)  # put while an earlier item is handled
    assert seen == [0, 1, 2, 9]
    assert q.empty()
    assert list(drain(queue.Queue())) == []
