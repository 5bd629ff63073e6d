"""Reading the Spark CN's Delta tables back by kwal commit ts (`consumers.spark.delta_sink`
writes them).

Every version kwal commits records the watermark it reflects (`userMetadata`
`kwal_watermark`). The TN's snapshot at a ts t up to the newest watermark is the version v
with the largest watermark w_v <= t, exact when no kwal commit falls in (w_v, t] (the next
version holds those). Anyone else reads the same tables with plain Delta:
`spark.read.format("delta").option("versionAsOf", v)`, `VERSION AS OF`, `table_changes`.
"""

from __future__ import annotations

from typing import Any

from consumers.core.exceptions import BelowHorizonError
from consumers.spark.delta_sink import watermarks


class AboveWatermarkError(ValueError):
    """The ts asked for is past what the Delta table reflects yet."""


def version_as_of(spark: Any, path: str, ts: int) -> int:
    """The Delta version of the table at `path` that is the TN's snapshot at `ts`."""
    marks = watermarks(spark, path)
    if not marks:
        raise AboveWatermarkError(f"{path}: no kwal version committed yet")
    if ts > marks[-1][1]:
        raise AboveWatermarkError(f"{path}: ts {ts} is past the watermark {marks[-1][1]}")
    at = [v for v, w in marks if w <= ts]
    if not at:
        raise BelowHorizonError(f"{path}: ts {ts} is before the first version (watermark {marks[0][1]})")
    return at[-1]


def read_as_of(spark: Any, path: str, ts: int) -> Any:
    """The table's rows at kwal commit ts `ts` (a DataFrame)."""
    version = version_as_of(spark, path, ts)
    return spark.read.format("delta").option("versionAsOf", version).load(path)
