"""The Spark CN reports its watermark lag to `kwal ops status` (issue 30, item 2).

The Spark CN keeps its Kafka positions in Spark's checkpoint location, not in a consumer
group, so the ops command's consumer-group lag cannot see it. Instead a
StreamingQueryListener publishes a status record (`infra.cn_status`) to the ops topic
after each micro-batch of the CN's query:

1. `onQueryProgress` for the query writing to `output` (matched by its name,
   `progress.query_name`): the committed progress's watermark per table (the batch's
   `foreachBatch` has committed it by then), the batch id and its input rows;
2. `onQueryIdle` (a processing-time trigger with nothing new): the same again, so an idle
   CN's report stays fresh while its watermark follows the TN's heartbeats;
3. `onQueryTerminated`: the producer is flushed.

`kwal ops status` shows each CN's newest report: its watermark, the lag (now minus the
watermark's time) and the report's age.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from pyspark.sql.streaming import StreamingQueryListener

from consumers.spark.progress import load_progress, query_name
from consumers.spark.reader import watermark
from infra.cn_status import publish_status, status_record
from infra.config import KwalConfig


class StatusListener(StreamingQueryListener):
    def __init__(self, cfg: KwalConfig, output: str | Path, name: str) -> None:
        self.cfg = cfg
        self.output = str(output)
        self.name = name
        self.query = query_name(output)
        self.producer = Producer(cfg.kafka_client(**{"linger.ms": 0, "acks": "all"}))
        self.published = 0
        self.errors: list[str] = []

    def report(self, batch_id: int, rows: int) -> None:
        prog = load_progress(self.output)
        if prog is None:
            return  # nothing committed yet: no watermark to report
        tables = {t: watermark(self.output, t) for t in sorted(prog.tables)}
        publish_status(self.producer, self.cfg, status_record(self.name, "spark", tables, batch_id, rows))
        self.published += 1

    def _safely(self, batch_id: int, rows: int) -> None:
        try:
            self.report(batch_id, rows)
        except Exception as e:  # noqa: BLE001 - a report lost must not stop Spark's listener bus
            self.errors.append(f"{type(e).__name__}: {e}")

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's names
        return None

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        p = event.progress
        if p.name == self.query:
            self._safely(int(p.batchId), int(p.numInputRows))

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        prog = load_progress(self.output)
        self._safely(prog.batch_id if prog is not None else -1, 0)

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        self.producer.flush(5)


def attach_status(spark: Any, cfg: KwalConfig, output: str | Path, name: str) -> StatusListener:
    """Register the listener on `spark` before the CN's query starts (so that its first
    progress is not missed)."""
    listener = StatusListener(cfg, output, name)
    spark.streams.addListener(listener)
    return listener
