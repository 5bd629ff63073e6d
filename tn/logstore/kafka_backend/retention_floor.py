"""The retention floor: the TN holds the WAL topic's retention above what it still needs.

Kafka deletes a WAL segment once its newest record is older than `retention.ms`
(or the partition exceeds `retention.bytes`), whatever the checkpoint says. When
checkpoints stall (the object store is down, say), entries above the truncation
point grow older and a finite retention would come due for them: acknowledged
commits would be lost. The guard at open (`retention.check_retention`) sees only
the moment it runs; this keeper runs for the writer's whole life.

Every `check_s` seconds, numbered as `check()` runs them:

1. read the topic's retention (describe_configs) and compute, from the writer's
   record map, the age of the oldest record holding an entry above the truncation
   point and the bytes from it to the end (`safe_retention`, margin 1);
2. the floor is that age + `headroom_ms` (bytes + `headroom_bytes`). A finite
   setting at or below its floor is raised to twice the floor, and the value the
   operator had set is remembered (in memory, and logged);
3. once the operator's value is above the floor again (checkpoints caught up),
   it is put back: the TN never leaves retention lower than the operator's;
4. when the broker refuses the change, `alarm` says so (and `kwal ops status`
   shows it through the driver's status): the raise is the protection, and a
   failed one is the alarm.

Why the headroom proves it early enough: after a check at age `a` that did not
raise, retention.ms > a + headroom. The next check runs at most `check_s` (+ a
broker round trip) later, when the oldest needed record is at most
a + check_s + rtt old, still below retention.ms as long as headroom > check_s +
rtt. Kafka measures a segment's age by its NEWEST record, which is never older
than the oldest needed record in it, so no segment holding a needed entry is
due while retention.ms exceeds that record's age. The bytes floor relies on
`headroom_bytes` exceeding what is written in one check interval. A TN restart
keeps whatever value is set (never lower than needed); its keeper restores
only values it raised itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from infra.topics import alter_topic_configs
from tn.logstore.kafka_backend.retention import (
    UNLIMITED,
    SafeRetention,
    read_retention,
)

log = logging.getLogger(__name__)


class RetentionFloor:
    """Keeps `topic`'s finite retention above what `needs()` says (module docstring)."""

    def __init__(
        self,
        admin: AdminClient,
        topic: str,
        needs: Callable[[], SafeRetention],
        *,
        check_s: float,
        headroom_ms: int,
        headroom_bytes: int,
        timeout_s: float = 10.0,
    ) -> None:
        self._admin = admin
        self.topic = topic
        self._needs = needs
        self.check_s = check_s
        self.headroom_ms = headroom_ms
        self.headroom_bytes = headroom_bytes
        self._timeout_s = timeout_s
        self.operator: dict[str, int] = {}  # setting -> the operator's value, while raised
        self.raised: dict[str, int] = {}  # setting -> the value this keeper set
        self.raises = 0
        self.alarm = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kwal-wal-retention", daemon=True)

    def start(self) -> RetentionFloor:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop checking. Waits at most a second: a check blocked on a broker that is gone
        must not hold up the writer's close (the thread is a daemon and ends after it)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(1.0)

    def _run(self) -> None:
        while not self._stop.wait(self.check_s):
            try:
                self.check()
            except Exception as e:  # noqa: BLE001 - the keeper goes on; the alarm says why
                self.alarm = f"the WAL retention check on {self.topic} failed: {e}"
                log.error("%s", self.alarm)

    def check(self) -> dict[str, int]:
        """Steps 1-4 once; returns the settings it changed."""
        # 1. what is set, what is needed
        current = read_retention(self._admin, self.topic, self._timeout_s)
        safe = self._needs()
        needed = bool(safe.needed_bytes)
        # 2. floors
        floors = {
            "retention.ms": safe.oldest_needed_age_ms + self.headroom_ms if needed else 0,
            "retention.bytes": (
                max(safe.needed_bytes.values()) + self.headroom_bytes if needed else 0
            ),
        }
        values = {"retention.ms": current.ms, "retention.bytes": current.bytes}
        change: dict[str, int] = {}
        for name, floor in floors.items():
            value = values[name]
            if needed and value != UNLIMITED and value <= floor:
                change[name] = 2 * floor
                self.operator.setdefault(name, value)
            # 3. the operator's value back once it is safe again
            elif name in self.operator and value == self.raised.get(name):
                original = self.operator[name]
                if original == UNLIMITED or original > floor:
                    change[name] = original
        if not change:
            return {}
        try:
            alter_topic_configs(self._admin, [self.topic], change, self._timeout_s)
        except KafkaException as e:
            # 4. the alarm
            self.alarm = (
                f"WAL topic {self.topic}: could not set {change} to keep retention above the "
                f"un-checkpointed entries (oldest {safe.oldest_needed_age_ms} ms old): {e}"
            )
            log.error("%s", self.alarm)
            return {}
        self.alarm = ""
        for name, value in change.items():
            if value == self.operator.get(name):
                self.operator.pop(name)
                self.raised.pop(name, None)
                log.warning("WAL topic %s: %s back to the operator's %d", self.topic, name, value)
            else:
                self.raised[name] = value
                self.raises += 1
                log.warning(
                    "WAL topic %s: %s raised to %d (the oldest un-checkpointed entry is %d ms "
                    "old, %d bytes behind; the operator's value %d returns once checkpoints "
                    "catch up)",
                    self.topic,
                    name,
                    value,
                    safe.oldest_needed_age_ms,
                    max(safe.needed_bytes.values(), default=0),
                    self.operator[name],
                )
        return change

    def status(self) -> dict[str, Any]:
        return {
            "check_s": self.check_s,
            "headroom_ms": self.headroom_ms,
            "operator": dict(self.operator),
            "raised": dict(self.raised),
            "raises": self.raises,
            "alarm": self.alarm,
        }
