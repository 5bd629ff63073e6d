"""The process the crash test kills: appends from several threads with the real
FileDriver and prints each completed LSN (flushed at once).

Usage: python crash_child.py DIR SEED   (then one line on stdin: start)

The child imports everything first and waits for the line, so the parent can
start the next child while it still checks the last one.

stdout protocol, one line each:
    READY <last_lsn>     after recovery, before the first append
    <lsn>                the future of entry <lsn> completed (in LSN order)
    T <lsn>              truncate(<lsn>) returned
"""

from __future__ import annotations

import random
import sys
import threading
import time
from concurrent.futures import Future

from tests.logstore.helpers import crash_size, payload
from tn.logstore.driver import LogStore
from tn.logstore.file_backend import FileDriver

THREADS = 4


def main() -> None:
    directory, seed = sys.argv[1], int(sys.argv[2])
    if sys.stdin.readline().strip() != "go":
        return  # the parent went away before starting this child
    driver = FileDriver(directory, segment_bytes=128 << 10, group_max_entries=32)
    store = LogStore(driver)
    out = sys.stdout
    out_lock = threading.Lock()

    def say(line: str) -> None:
        with out_lock:
            out.write(line + "\n")
            out.flush()

    def completed(future: Future[int]) -> None:
        if future.exception() is None:
            say(str(future.result()))

    say(f"READY {driver.last_lsn()}")

    def worker(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        while True:
            future = store.append(lambda lsn: payload(lsn, crash_size(lsn)))
            future.add_done_callback(completed)
            lsn = future.result()
            if k == 0 and lsn % 300 == 0:
                store.truncate(lsn - 150)
                say(f"T {lsn - 150}")
            if rng.random() < 0.3:
                time.sleep(rng.random() / 1000)

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
