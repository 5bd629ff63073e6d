"""A WAL writer for the SIGKILL test: appends under load, prints what is acknowledged.

Usage: python -m tests.logstore_kafka.crash_child BOOTSTRAP PREFIX INDEX

Prints (each line flushed at once):
  START <recovered last_lsn> <truncated> <epoch>
  READY
  ACK <lsn>        once the entry's future succeeded (completion order = LSN order)
  TRUNC <lsn>      once truncate(lsn) returned (the point is durable)
Payloads are b"<INDEX>:<lsn>:" + padding, so the parent knows who wrote what.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import Future

from infra.config import KwalConfig
from tn.logstore.driver import LogStore
from tn.logstore.kafka_backend import KafkaDriver


def main() -> None:
    bootstrap, prefix, index = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cfg = KwalConfig.load(environ={}).with_bootstrap(bootstrap)
    cfg.topics.prefix = prefix
    cfg.topics.wal_partitions = 2
    cfg.wal.group_max_entries = 16
    cfg.wal.window = 256
    driver = KafkaDriver(cfg, delete_records=False, writer_id=f"child{index}")
    out = sys.stdout
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            out.write(line + "\n")
            out.flush()

    say(f"START {driver.last_lsn()} {driver.truncated()} {driver.epoch}")
    store = LogStore(driver)

    def acked(f: Future[int]) -> None:
        if f.exception() is None:
            say(f"ACK {f.result()}")

    def load() -> None:
        while True:
            last: Future[int] | None = None
            for _ in range(16):
                last = store.append(lambda lsn: f"{index}:{lsn}:".encode() + b"x" * 64)
                last.add_done_callback(acked)
            assert last is not None
            last.result(30)

    say("READY")
    for _ in range(6):
        threading.Thread(target=load, daemon=True).start()
    time.sleep(0.3)
    point = max(driver.truncated(), driver.acked_lsn() - 40)
    if point > driver.truncated():
        driver.truncate(point)
        say(f"TRUNC {point}")
    time.sleep(60)


if __name__ == "__main__":
    main()
