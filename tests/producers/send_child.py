"""A service that sends one transaction under a request id it was given and is then
killed (SIGKILL) by the test before it reads the result: `python -m
tests.producers.send_child REQUEST_ID KEY` with the config in `KWAL_*` variables.
Prints ``sent`` once the broker acknowledged the request, then waits on stdin."""

from __future__ import annotations

import sys

from infra.config import KwalConfig
from producers import Client


def main() -> None:
    request_id, key = sys.argv[1], int(sys.argv[2])
    client = Client(KwalConfig.load(), "killed-service")
    txn = client.begin()
    txn.insert("retry.t", [{"id": key, "v": "once"}])
    txn.commit_async(request_id=request_id)
    client.flush(30)  # the request is on the requests topic
    print("sent", flush=True)
    sys.stdin.read()  # until the test kills this process


if __name__ == "__main__":
    main()
