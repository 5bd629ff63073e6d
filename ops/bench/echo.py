"""The commit bench's ceiling: the request -> result round trip through Kafka, with no TN.

Every kwal commit crosses the broker twice: the client's request is produced
to the requests topic and fetched by the TN; the TN's result is produced to
the results topic and fetched by the client. This measures those two hops and
nothing else (no decoding, no transaction, no WAL), with the same client and
TN settings (idempotent producers with acks=all and the same linger, the same
fetch wait), so any design that routes commits through Kafka topics on this
broker and this machine is bounded by it.

1. `EchoServer` starts `python -m ops.bench.echo` (a subprocess, as the TN
   is one): it consumes the echo requests topic and produces each record back
   to the echo results topic with the same key, and prints "ready" once
   assigned;
2. `EchoClients.send` produces one small request with a unique key and
   returns a future; one reader thread consumes the results topic and
   completes the future of each key it sees;
3. the commit bench drives N chained clients over `send`, exactly as it
   drives kwal's clients (one request in flight per client).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from concurrent.futures import Future
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from infra.config import KwalConfig
from infra.kafka_io import poll_batch
from infra.processes import REPO, child_env
from infra.topics import TopicSpec, ensure_topics
from producers.client import client_producer_conf, results_reader_conf
from tn.service.service import tn_consumer_conf, tn_producer_conf

READY = "ready"
PAYLOAD = bytes(64)  # a small request, like a 1-row insert


def echo_topics(cfg: KwalConfig) -> tuple[str, str]:
    return cfg.topics.name("bench-echo-requests"), cfg.topics.name("bench-echo-results")


class EchoServer:
    """The echo subprocess (step 1); a context manager that stops it on exit."""

    def __init__(self, cfg: KwalConfig, ready_timeout_s: float = 30.0) -> None:
        requests, results = echo_topics(cfg)
        ensure_topics(
            cfg, [TopicSpec(t, 1, {"cleanup.policy": "delete"}) for t in (requests, results)]
        )
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "ops.bench.echo"],
            cwd=REPO,
            env=child_env(cfg),
            stdout=subprocess.PIPE,
            text=True,
        )
        line = _readline(self._proc, ready_timeout_s)
        if line.strip() != READY:
            self.stop()
            raise RuntimeError(f"the echo server did not start (it printed {line!r})")

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def exit_code(self) -> int | None:
        """None while the subprocess runs."""
        return self._proc.poll()

    def __enter__(self) -> EchoServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _readline(proc: subprocess.Popen[str], timeout_s: float) -> str:
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(proc.stdout.readline() if proc.stdout else ""))
    t.start()
    t.join(timeout_s)
    return out[0] if out else ""


class EchoClients:
    """Step 2: requests out through one producer, echoes back through one reader."""

    def __init__(self, cfg: KwalConfig) -> None:
        self._requests, results = echo_topics(cfg)
        self._producer = Producer(client_producer_conf(cfg))
        self._pending: dict[bytes, Future[None]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = Consumer(results_reader_conf(cfg))
        _, high = self._consumer.get_watermark_offsets(TopicPartition(results, 0), timeout=10)
        self._consumer.assign([TopicPartition(results, 0, max(0, high))])
        self._threads = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._poll, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def send(self) -> Future[None]:
        key = uuid.uuid4().bytes
        fut: Future[None] = Future()
        with self._lock:
            self._pending[key] = fut
        self._producer.produce(self._requests, value=PAYLOAD, key=key)
        return fut

    def pending(self) -> int:
        """Requests sent whose echo has not come back."""
        with self._lock:
            return len(self._pending)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.1)

    def _read(self) -> None:
        while not self._stop.is_set():
            for msg in poll_batch(self._consumer, 1000, 0.1):
                if msg.error() is not None:
                    continue
                with self._lock:
                    fut = self._pending.pop(msg.key() or b"", None)
                if fut is not None:
                    fut.set_result(None)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        self._producer.flush(5)
        self._consumer.close()


def serve(cfg: KwalConfig) -> None:
    """Step 1, in the subprocess: echo until terminated."""
    requests, results = echo_topics(cfg)
    consumer = Consumer(tn_consumer_conf(cfg, f"bench-echo-{uuid.uuid4().hex[:8]}"))
    _, high = consumer.get_watermark_offsets(TopicPartition(requests, 0), timeout=10)
    consumer.assign([TopicPartition(requests, 0, max(0, high))])
    producer = Producer(tn_producer_conf(cfg))
    print(READY, flush=True)
    while True:
        msgs: list[Any] = poll_batch(consumer, 1000, 0.1)
        for msg in msgs:
            if msg.error() is None:
                producer.produce(results, value=msg.value(), key=msg.key())
        producer.poll(0)


if __name__ == "__main__":
    serve(KwalConfig.load())
