"""The Spark CN job's command-line arguments, declared once for `kwal cn spark` (ops.cli)
and for `spark-submit consumers/spark/job.py` (`job.main`).

Only argparse here: `kwal` builds its whole parser for every command, and importing the job
itself would load pyarrow and PySpark for `kwal status` too.
"""

from __future__ import annotations

import argparse

FROM_CHECKPOINT = ("auto", "always", "never")

# The job's Kafka source (`consumers.spark.source.kafka_stream`): kwal's own Python Data
# Source, which decodes where it reads ("kwal"), or Spark's built-in `kafka` source with
# kwal's decoder in a `mapInArrow` ("builtin"). The default is the faster of the two as
# `kwal bench spark` measured them (docs/perf-spark.md).
SOURCES = ("kwal", "builtin")
DEFAULT_SOURCE = "kwal"


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments `consumers.spark.job.run` reads."""
    parser.add_argument("--tables", required=True, help="db.t1,db.t2")
    parser.add_argument("--output", required=True,
                        help="where the Delta tables go: a local path or s3a://bucket/prefix")
    parser.add_argument("--work-dir", help="local directory for the change log, progress and "
                        "checkpoint (default OUTPUT; required for an s3a:// output)")
    parser.add_argument("--trigger", default="1s", help="a processing-time interval, or available-now")
    parser.add_argument("--checkpoint", help="checkpointLocation (default OUTPUT/_checkpoint)")
    parser.add_argument("--max-records-per-trigger", type=int)
    parser.add_argument("--compact-interval", type=float, default=10.0,
                        help="seconds between compactions of a table's state")
    parser.add_argument("--timeout", type=float, default=0.0, help="stop after this long (0 = never)")
    parser.add_argument(
        "--source", choices=list(SOURCES), default=None,
        help=f"the Kafka source: kwal's own (decodes where it reads) or Spark's built-in "
        f"kafka source (default {DEFAULT_SOURCE}; when this is not given, "
        "KWAL_SPARK_BUILTIN_KAFKA=1 or 0 picks builtin or kwal)",
    )
    parser.add_argument("--master", help="Spark master (default: local[2] unless submitted)")
    parser.add_argument(
        "--from-checkpoint", default="auto", choices=list(FROM_CHECKPOINT),
        help="how a new job starts: from the topics' first records, or from the newest "
        "checkpoint in the object store (auto: only when a topic was truncated)",
    )
