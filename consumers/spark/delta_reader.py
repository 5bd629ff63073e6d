"""Reading the Spark CN's Delta tables back by kwal commit ts (`consumers.spark.delta_sink`
writes them).

Every version kwal commits records the watermark it reflects (`userMetadata`
`kwal_watermark`, with `kwal_batch`, the micro-batch id). The TN's snapshot at a ts t up to
the newest watermark (`read_as_of`):

1. the version v with the largest watermark w_v <= t: when w_v == t (or v is the newest),
   that version is the answer;
2. else the next kwal version n (w_v < t < w_n, micro-batch b) holds every change with a
   commit ts in (w_v, w_n]. From Delta's Change Data Feed of versions v+1..n: the inserted
   rows with `__commit_ts` <= t (a row's `__commit_ts` is its insert's ts);
3. from the table's interval changes (`<path>/_kwal_changes`, `__batch` = b, committed
   before version n: `delta_sink.write_interval_changes`): the deletes with their own ts
   <= t, and the rows b inserted with ts <= t but also deleted (the MERGE never wrote them);
4. the answer: version v's rows + 2.'s + 3.'s rows, minus the row ids 3. deleted at or
   before t (one row per row id).

Anyone else reads the same tables with plain Delta: `spark.read.format("delta").option(
"versionAsOf", v)`, `VERSION AS OF`, `table_changes`.
"""

from __future__ import annotations

from typing import Any

from consumers.core.exceptions import BelowHorizonError, TableNotFoundError
from consumers.spark.delta_sink import (
    BATCH_COL,
    DELETE,
    DROPPED_PROPERTY,
    INSERT,
    OP,
    interval_path,
    kwal_versions,
    watermarks,
)
from schemas.logtail import COMMIT_TS, ROW_ID


class AboveWatermarkError(ValueError):
    """The ts asked for is past what the Delta table reflects yet."""


def _versions_as_of(spark: Any, path: str, ts: int) -> tuple[tuple[int, int, int], tuple[int, int, int] | None]:
    """The kwal version with the largest watermark <= `ts` and, when that watermark is below
    `ts`, the next one (whose changes cover `ts`). Refuses a ts past the newest watermark
    or before the first."""
    versions = kwal_versions(spark, path)
    if not versions:
        raise AboveWatermarkError(f"{path}: no kwal version committed yet")
    if ts > versions[-1][1]:
        raise AboveWatermarkError(f"{path}: ts {ts} is past the watermark {versions[-1][1]}")
    at = [i for i, (_, w, _) in enumerate(versions) if w <= ts]
    if not at:
        raise BelowHorizonError(
            f"{path}: ts {ts} is before the first version (watermark {versions[0][1]})"
        )
    i = at[-1]
    return versions[i], (versions[i + 1] if versions[i][1] < ts else None)


def version_as_of(spark: Any, path: str, ts: int) -> int:
    """The Delta version of the table at `path` with the largest watermark <= `ts` (the TN's
    snapshot at `ts` when its watermark is `ts`)."""
    return _versions_as_of(spark, path, ts)[0][0]


def read_as_of(spark: Any, path: str, ts: int) -> Any:
    """The table's rows at kwal commit ts `ts` (a DataFrame of `__row_id`, `__commit_ts`
    and the user columns): steps in the module docstring."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    (version, _, _), following = _versions_as_of(spark, path, ts)
    base = spark.read.format("delta").option("versionAsOf", version).load(path)
    if following is None:
        return base  # 1.
    upto, _, batch = following
    feed = (  # 2.
        spark.read.format("delta").option("readChangeFeed", "true")
        .option("startingVersion", version + 1).option("endingVersion", upto).load(path)
    )
    inserted = feed.filter((F.col("_change_type") == "insert") & (F.col(COMMIT_TS) <= ts)).drop(
        "_change_type", "_commit_version", "_commit_timestamp"
    )
    rows = base.unionByName(inserted, allowMissingColumns=True)
    changes_path = interval_path(path)
    if DeltaTable.isDeltaTable(spark, changes_path):  # 3.
        changes = spark.read.format("delta").load(changes_path).filter(
            (F.col(BATCH_COL) == batch) & (F.col(COMMIT_TS) <= ts)
        )
        passing = changes.filter(F.col(OP) == INSERT).drop(OP, BATCH_COL)
        deleted = changes.filter(F.col(OP) == DELETE).select(ROW_ID)
        rows = rows.unionByName(passing, allowMissingColumns=True).join(deleted, ROW_ID, "left_anti")
    return rows.dropDuplicates([ROW_ID])  # 4.


def incarnation_paths(spark: Any, output: str, table: str) -> list[str]:
    """The Delta tables of `table`'s incarnations under `output` (`delta_sink.
    incarnation_path`: `<db>.<table>` and `<db>.<table>@<table id>`), listed through
    Hadoop's filesystem so that local paths and s3a:// alike work."""
    jvm = spark.sparkContext._jvm
    root = jvm.org.apache.hadoop.fs.Path(output)
    fs = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(root):
        raise TableNotFoundError(f"{output}: no Spark CN output there")
    names = [s.getPath().getName() for s in fs.listStatus(root) if s.isDirectory()]
    paths = [f"{output.rstrip('/')}/{n}" for n in names if n == table or n.startswith(f"{table}@")]
    return sorted(p for p in paths if fs.exists(jvm.org.apache.hadoop.fs.Path(f"{p}/_delta_log")))


def _dropped_ts(spark: Any, path: str) -> int:
    from delta.tables import DeltaTable

    row = DeltaTable.forPath(spark, path).detail().select("properties").first()
    props = (row[0] if row is not None else None) or {}
    return int(props.get(DROPPED_PROPERTY, 0))


def table_as_of(spark: Any, output: str, table: str, ts: int | None) -> tuple[Any, int]:
    """`table`'s rows at kwal ts `ts` (None: its newest watermark), from the incarnation
    alive then, and the ts answered. Refuses a ts past the watermark, before the first
    version, or when the table does not exist at it (TableNotFoundError)."""
    paths = incarnation_paths(spark, output, table)
    if not paths:
        raise TableNotFoundError(f"{table}: no Delta table of it under {output}")
    lives = []  # (first watermark, last watermark, drop ts, path)
    for p in paths:
        marks = watermarks(spark, p)
        if marks:
            lives.append((marks[0][1], marks[-1][1], _dropped_ts(spark, p), p))
    if not lives:
        raise AboveWatermarkError(f"{table}: no kwal version committed yet under {output}")
    lives.sort()
    if ts is None:
        first, last, dropped, path = lives[-1]
        if dropped:
            raise TableNotFoundError(f"{table} was dropped at ts {dropped}")
        return read_as_of(spark, path, last), last
    alive = [life for life in lives if life[0] <= ts and not (life[2] and ts >= life[2])]
    if not alive:
        if ts > lives[-1][1] and not lives[-1][2]:
            raise AboveWatermarkError(f"{table}: ts {ts} is past the watermark {lives[-1][1]}")
        raise TableNotFoundError(f"table {table} does not exist at ts {ts} under {output}")
    return read_as_of(spark, alive[-1][3], ts), ts


def user_rows(df: Any) -> list[dict[str, Any]]:
    """A table's rows as a user sees them: its own columns (not kwal's `__` ones), in row
    id order (an update gives a row a new row id: not the TN's block order)."""
    cols = [c for c in df.columns if not c.startswith("__")]
    rows: list[dict[str, Any]] = df.orderBy(ROW_ID).select(*cols).toArrow().to_pylist()
    return rows


def run_query(args: Any, cfg: Any) -> int:
    """`kwal cn query --spark-output PATH --table db.t [--ts T] [--json]`: the table from
    the Spark CN's Delta tables (no Kafka): user columns, one row per line."""
    import json
    import sys

    from consumers.spark.jars import delta_jars
    from consumers.spark.session import DELTA_CONF, build_session, s3a_conf

    output = str(args.spark_output)
    conf = dict(DELTA_CONF)
    if output.startswith("s3a://"):
        conf.update(s3a_conf(cfg.objectstore))
    spark = build_session("kwal-cn-query", jars=delta_jars(), conf=conf)
    try:
        df, ts = table_as_of(spark, output, args.table, args.ts or None)
    except (AboveWatermarkError, BelowHorizonError, TableNotFoundError) as e:
        print(f"kwal cn query: {e}", file=sys.stderr)
        return 1
    rows = user_rows(df)
    for row in rows:
        print(json.dumps(row, default=str) if getattr(args, "json", False) else row)
    print(f"({len(rows)} rows as of ts {ts})", file=sys.stderr)
    return 0
