"""Truncating the logtail topics after a checkpoint (seed 001; like the WAL, seed 004).

A checkpoint's manifest records, per logtail topic (the catalog topic too), the
offset from which a CN bootstrapping from it follows the topic
(tn.logtail.publisher, step 5). Records below those offsets are never read by
such a CN again. The checkpoint runner (step 5) hands this truncator the
PREVIOUS checkpoint's offsets, so that a CN lagging by less than one checkpoint
interval keeps its place:

1. where the broker has DeleteRecords (`kwal doctor`), delete each topic's
   records below its offset (once per offset: the offsets only grow);
2. otherwise truncation is logical only: the manifest's offsets are where CNs
   start, the records stay until the topic's retention removes them (`kwal ops
   retention` says which retention is safe); the truncator says so once, in
   the log and in `note`.

A failed deletion is logged and retried at the next checkpoint.
"""

from __future__ import annotations

import logging

from confluent_kafka.admin import AdminClient

from infra.capabilities import deletes_records
from infra.config import KwalConfig
from infra.kafka_io import RecordDeleter
from infra.topics import admin_client

log = logging.getLogger(__name__)


class LogtailTruncator:
    def __init__(
        self, cfg: KwalConfig, physical: bool | None = None, timeout_s: float = 10.0
    ) -> None:
        self.cfg = cfg
        self.physical = physical  # None: ask `kwal doctor`'s probe at the first call
        self.note = ""
        self._deleter = RecordDeleter(timeout_s, retried="at the next checkpoint")
        self._admin: AdminClient | None = None  # made at the first deletion, then kept

    @property
    def deleted_before(self) -> dict[str, int]:
        """Topic -> the offset everything below is gone."""
        return {topic: off for (topic, _), off in self._deleter.deleted_before.items()}

    def __call__(self, offsets: dict[str, int]) -> None:
        if self.physical is None:  # here, in the checkpoint thread, not at TN start-up
            self.physical = deletes_records(self.cfg, "logtail")
        if not self.physical:
            if not self.note:
                self.note = (
                    f"the broker at {self.cfg.bootstrap} lacks DeleteRecords: logtail truncation "
                    "is logical only (CNs start at the checkpoint's offsets; records stay)"
                )
                log.warning("%s", self.note)
            return
        if self._admin is None:
            self._admin = admin_client(self.cfg)
        self._deleter.delete(self._admin, {(topic, 0): o for topic, o in offsets.items()})
