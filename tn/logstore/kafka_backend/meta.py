"""The WAL's meta topic: writer epochs and the durable truncation point.

A compacted, single-partition topic (`cfg.topics.wal_meta`). Records (key ->
JSON value):

- `epoch/<n>/<writer>` -> `{"epoch": n, "writer": w}`: a claim of epoch n. The
  first claim of n in offset order wins; distinct keys keep every claim
  through compaction.
- `base/<n>` -> `{"epoch": n, "writer": w, "base": b}`: the LSN the winner of
  epoch n recovered to (its replay's contiguous end). Entries an older epoch
  wrote above `b` are never part of the log.
- `truncated` -> `{"lsn": t, "offsets": {"<partition>": o}}`: the logical
  truncation point (monotonic: the reader takes the maximum it sees) and, per
  WAL partition, the offset before which every record holds only LSNs <= t
  (`replay.deletable_offsets`). A starting writer reads each partition from
  there (never from offset 0), whether or not the broker deleted the prefix;
  the reader takes each partition's maximum (every recorded offset is valid
  for the highest point). Records without `offsets` (older writers) mean 0.
- `sync/<writer>` -> `{"writer": w}`: an end marker for a re-read (ignored).

Claiming an epoch (`claim_epoch`), numbered as the driver runs it:

1. produce a claim for a guessed epoch (acks=all) and note its offset; the
   claim doubles as the meta topic's end marker;
2. read the meta topic from the start up to that offset;
3. if this claim is the first of its epoch and no higher epoch was claimed
   before it, it is won; otherwise guess max(seen) + 1 and go to 1.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Producer

from infra.kafka_io import IDLE_FETCH_WAIT_MS
from infra.kafka_txn import TxnChannel
from tn.logstore.kafka_backend.kio import produce_wait, read_until, reader_conf

TRUNCATED_KEY = b"truncated"


@dataclass
class MetaState:
    """What the meta topic says, as read up to some offset."""

    truncated: int = 0
    truncated_offsets: dict[int, int] = field(default_factory=dict)  # partition -> read from
    claims: dict[int, str] = field(default_factory=dict)  # epoch -> winning writer
    bases: dict[int, int] = field(default_factory=dict)  # epoch -> recovered base (winner's)
    max_epoch: int = 0

    def apply(self, key: bytes, value: bytes | None) -> None:
        """Fold one meta record into the state."""
        if value is None:
            return
        try:
            doc: dict[str, Any] = json.loads(value)
        except ValueError:
            return
        if key == TRUNCATED_KEY:
            self.truncated = max(self.truncated, int(doc["lsn"]))
            for p, off in (doc.get("offsets") or {}).items():
                part = int(p)
                self.truncated_offsets[part] = max(self.truncated_offsets.get(part, 0), int(off))
        elif key.startswith(b"epoch/"):
            epoch = int(doc["epoch"])
            self.claims.setdefault(epoch, str(doc["writer"]))
            self.max_epoch = max(self.max_epoch, epoch)
        elif key.startswith(b"base/"):
            epoch = int(doc["epoch"])
            if self.claims.get(epoch) == doc["writer"]:
                self.bases[epoch] = int(doc["base"])


def _dumps(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True).encode()


def truncation_value(lsn: int, offsets: Mapping[int, int]) -> bytes:
    """The `truncated` record's value: the point and the per-partition read-from offsets."""
    return _dumps({"lsn": lsn, "offsets": {str(p): int(o) for p, o in sorted(offsets.items())}})


class MetaLog:
    """Reads and writes the meta topic through the driver's one producer."""

    def __init__(
        self, producer: Producer | TxnChannel, reader_base: Mapping[str, Any], topic: str, timeout_s: float
    ) -> None:
        self._producer = producer
        self._reader_base = reader_base
        self.topic = topic
        self._timeout_s = timeout_s

    def read(self, end: int) -> MetaState:
        """The state from every meta record at offsets < end."""
        state = MetaState()
        for msg in read_until(self._reader_base, self.topic, {0: end}, self._timeout_s):
            state.apply(msg.key() or b"", msg.value())
        return state

    def latest_truncation(self, writer: str) -> tuple[int, int]:
        """(truncation point, highest epoch claimed) as of now: a `sync/<writer>` record is
        produced and the topic read up to it (its exact offset is the end)."""
        _, offset = produce_wait(
            self._producer,
            self.topic,
            _dumps({"writer": writer}),
            self._timeout_s,
            key=f"sync/{writer}".encode(),
            partition=0,
        )
        state = self.read(offset + 1)
        return state.truncated, state.max_epoch

    def claim_epoch(self, writer: str, max_rounds: int = 8) -> tuple[int, MetaState, int]:
        """Win a new epoch (protocol steps 1-3 above); return (epoch, state before it, claim offset)."""
        guess = 1
        for _ in range(max_rounds):
            key = f"epoch/{guess}/{writer}".encode()
            _, offset = produce_wait(
                self._producer,
                self.topic,
                _dumps({"epoch": guess, "writer": writer}),
                self._timeout_s,
                key=key,
                partition=0,
            )
            state = self.read(offset + 1)
            if state.claims.get(guess) == writer and state.max_epoch == guess:
                state.claims.pop(guess)
                state.max_epoch = max(state.claims, default=0)
                return guess, state, offset
            guess = state.max_epoch + 1
        raise RuntimeError(f"could not claim a writer epoch on {self.topic} in {max_rounds} rounds")

    def record_base(self, epoch: int, writer: str, base: int) -> None:
        produce_wait(
            self._producer,
            self.topic,
            _dumps({"epoch": epoch, "writer": writer, "base": base}),
            self._timeout_s,
            key=f"base/{epoch}".encode(),
            partition=0,
        )

    def record_truncation(self, lsn: int, offsets: Mapping[int, int]) -> None:
        produce_wait(
            self._producer,
            self.topic,
            truncation_value(lsn, offsets),
            self._timeout_s,
            key=TRUNCATED_KEY,
            partition=0,
        )


def watcher_conf(reader_base: Mapping[str, Any]) -> dict[str, Any]:
    """The fence watch's reader: an internal reader (`kio.reader_conf`) whose empty fetches
    the broker may hold `IDLE_FETCH_WAIT_MS`: the meta topic moves only when a writer
    claims the WAL."""
    return {**reader_conf(reader_base), "fetch.wait.max.ms": IDLE_FETCH_WAIT_MS}


class MetaWatcher:
    """Tails the meta topic after this writer's claim; calls `on_fenced(epoch)` once
    when a higher epoch is claimed (a newer writer took the WAL over)."""

    def __init__(
        self,
        reader_base: Mapping[str, Any],
        topic: str,
        start_offset: int,
        epoch: int,
        on_fenced: Any,
    ) -> None:
        import threading

        from confluent_kafka import Consumer, TopicPartition

        self._consumer = Consumer(watcher_conf(reader_base))
        self._consumer.assign([TopicPartition(topic, 0, start_offset)])
        self._epoch = epoch
        self._on_fenced = on_fenced
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kwal-wal-meta-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for msg in self._consumer.consume(100, 0.1):
                    if msg.error() is not None:
                        continue
                    state = MetaState()
                    state.apply(msg.key() or b"", msg.value())
                    if state.max_epoch > self._epoch:
                        self._on_fenced(state.max_epoch)
                        return
        finally:
            self._consumer.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
