"""Many threads committing at once on the in-process engine (MemoryDriver): every
commit lands exactly once, with a commit ts of its own, and a read sees them all.
(Commit throughput is a benchmark figure: `kwal bench commit`.)"""

from __future__ import annotations

import threading

from tests.tn.helpers import new_engine, setup_table

THREADS = 64
PER_THREAD = 50


def test_64_threads_of_commits_all_land_once() -> None:
    e, _ = new_engine()
    setup_table(e)
    stamps: list[list[int]] = [[] for _ in range(THREADS)]

    def client(i: int) -> None:
        for j in range(PER_THREAD):
            txn = e.begin()
            txn.insert("db", "t", [{"id": i * 1_000_000 + j, "v": "x"}])
            stamps[i].append(txn.commit().result(timeout=60))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        every = [ts for per in stamps for ts in per]
        assert len(every) == THREADS * PER_THREAD
        assert len(set(every)) == len(every)  # one commit ts per transaction
        for per in stamps:  # a client's later commit is never ordered before its earlier one
            assert per == sorted(per)
        ids = sorted(e.read("db", "t").column("id").to_pylist())
        assert ids == sorted(i * 1_000_000 + j for i in range(THREADS) for j in range(PER_THREAD))
    finally:
        e.close()
