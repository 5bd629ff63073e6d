"""A kwal table's state as a Delta Lake table: one micro-batch's changes applied with one
`MERGE`, exactly once, stamped with the kwal watermark it reflects.

Layout: `<output>/<db>.<table>` (a local path or `s3a://bucket/prefix/...`), one Delta table
per kwal table, one row per live row id: `__row_id`, `__commit_ts` (the ts of the insert
that made the row) and the user columns. Change Data Feed is on (`delta.enableChangeDataFeed`)
so downstream jobs can stream the table's changes (`table_changes`, `readChangeFeed`).

`merge_batch`, per micro-batch and table:

1. reduce the batch's changes to one action per row id: a row id is inserted at most once
   and deleted at most once in kwal (an UPDATE is a delete of the old row id and an insert
   of a new one), and a record the TN re-delivered repeats the same (row id, op), so
   inserted-and-deleted -> nothing, inserted -> INSERT, deleted -> DELETE;
2. when the batch has deletes, append its interval changes (each delete with its own ts,
   and the rows it both inserted and deleted) to `<path>/_kwal_changes`, with the same
   `txnAppId`/`txnVersion` as step 3 and before it: what a read inside the version needs
   and Delta's change feed cannot carry (`write_interval_changes`;
   `consumers.spark.delta_reader.read_as_of`);
3. `MERGE INTO` the table on `__row_id` with Delta's idempotent-write options
   (`txnAppId` = the job's id, `txnVersion` = the micro-batch id): Delta records the pair in
   the same commit as the data, and skips a write whose version is at or below the one it
   recorded for the app id. A batch replayed after a crash is therefore a no-op: the
   data and "batch N is in this table" commit atomically, per table (the job's
   `_progress` file only caches its decoder and catalog state: docs/delta.md);
4. the commit's `userMetadata` is `{"kwal_watermark": ts, "kwal_batch": id, "kwal_app":
   app id}`: the ts up to
   which the version reflects the TN (`consumers.spark.delta_reader` reads it for time
   travel by commit ts). A batch with no change for the table still commits (an empty
   append, see `merge_batch`) when the watermark moved, so an idle table's watermark
   advances.

Schema evolution (ALTER TABLE ADD COLUMN) uses Delta's automatic schema merge for MERGE
(`spark.databricks.delta.schema.autoMerge.enabled`, set per statement). A dropped table ends
with a version that sets the table property `kwal.dropped_ts`; a table created again under
the same name starts a new incarnation in a Delta table of its own: the first incarnation the
job saw at `<db>.<table>`, each later one at `<db>.<table>@<table id>` (`incarnation_path`),
so rows of two incarnations never mix and each path keeps its own history.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from schemas.logtail import COMMIT_TS, ROW_ID

OP = "__op"
INSERT, DELETE = "I", "D"
WATERMARK_KEY = "kwal_watermark"
BATCH_KEY = "kwal_batch"
APP_KEY = "kwal_app"
DROPPED_PROPERTY = "kwal.dropped_ts"
# The interval changes table of a Delta table (`write_interval_changes`): nested in the
# table's directory (Delta and delta-rs read a table's files from its log, and VACUUM skips
# directories whose name starts with `_`), so a drop, a discard or a copy of the table takes
# it along.
INTERVAL_CHANGES = "_kwal_changes"
BATCH_COL = "__batch"

_TXN_APP = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_AUTO_MERGE = "spark.databricks.delta.schema.autoMerge.enabled"


def table_path(output: str, table: str) -> str:
    """Where kwal table `db.table` lives under `output` (a local path or an s3a:// URL)."""
    db, _, name = table.partition(".")
    if not db or not name:
        raise ValueError(f"a table is db.table, got {table!r}")
    return f"{output.rstrip('/')}/{table}"


def incarnation_path(output: str, table: str, number: int, table_id: int) -> str:
    """The Delta table of incarnation `number` (0: the first the job saw) of `table`, with
    catalog table id `table_id`: `table_path` for the first, `<path>@<table id>` after."""
    base = table_path(output, table)
    return base if number == 0 else f"{base}@{table_id}"


def app_id(output: str) -> str:
    """The job's `txnAppId`: named by its output, the same in every process (Python's
    `hash` of a str is not)."""
    return "kwal-cn-" + hashlib.sha256(output.rstrip("/").encode()).hexdigest()[:16]


def _flagged(changes: Any) -> Any:
    """The batch's inserts and deletes with `__first` (the first row of its (row id, op):
    a record the TN re-delivered repeats one) and `__both` (the row id has both an insert
    and a delete in the batch). One window, partitioned by row id and ordered by op (D
    before I): one shuffle (two windows over different keys cost two)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ordered = Window.partitionBy(ROW_ID).orderBy(OP)
    whole = ordered.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    previous = F.lag(OP).over(ordered)
    return (
        changes.filter(F.col(OP).isin(INSERT, DELETE))
        .withColumn("__first", previous.isNull() | (previous != F.col(OP)))
        .withColumn("__both", F.min(OP).over(whole) != F.max(OP).over(whole))
    )


def net_changes(changes: Any, has_deletes: bool = True, unique: bool = False) -> Any:
    """Step 1: one row per row id that the batch inserted or deleted but not both, with its
    action in `__op`. `changes` has `__op` (I or D), `__row_id`, `__commit_ts` and the user
    columns (null on deletes).

    What the caller knows makes it cheaper: `unique` (no row id appears twice among the
    inserts and deletes: `distinct_row_ids`): the changes as they are, no shuffle;
    `has_deletes` False: one row per row id (`dropDuplicates`); else `_flagged`."""
    from pyspark.sql import functions as F

    rows = changes.filter(F.col(OP).isin(INSERT, DELETE))
    if unique:
        return rows
    if not has_deletes:
        return rows.dropDuplicates([ROW_ID])
    flagged = _flagged(changes)
    return flagged.filter(F.col("__first") & ~F.col("__both")).drop("__first", "__both")


def interval_changes(changes: Any, unique: bool = False) -> Any:
    """What a read inside the version needs and its Change Data Feed cannot carry: every
    delete with its own commit ts (`__op` D, `__commit_ts` = the delete's ts, user columns
    null; Delta's change feed gives a deleted row's preimage, whose `__commit_ts` is its
    insert's), and the whole rows the batch both inserted and deleted (`__op` I: the MERGE
    writes nothing of them, yet they were live in between). `unique` as for
    `net_changes`: then no row id was both inserted and deleted, and the deletes are all."""
    from pyspark.sql import functions as F

    if unique:
        return changes.filter(F.col(OP) == DELETE)
    flagged = _flagged(changes)
    keep = F.col("__first") & ((F.col(OP) == DELETE) | F.col("__both"))
    return flagged.filter(keep).drop("__first", "__both")


def distinct_row_ids(changes: Any) -> bool:
    """True when no row id appears twice among the inserts and deletes of `changes`, read
    on the driver with pyarrow from the local Parquet files `changes` reads (the job's
    change log is local: `consumers.spark.job.check_output`): a few milliseconds for a
    batch of 200,000 rows, against a shuffle of the whole batch (`net_changes`). False
    (the shuffle decides) when `changes` is not made of local Parquet files only, or a file
    lacks the columns. The files may hold more rows than `changes` keeps (a filter): a row
    id unique among them is unique among its rows."""
    from urllib.parse import unquote, urlparse

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        files = list(changes.inputFiles())
    except Exception:  # not a file-based plan
        return False
    if not files or not all(f.startswith("file:") and f.endswith(".parquet") for f in files):
        return False
    try:
        tables = [pq.read_table(unquote(urlparse(f).path), columns=[OP, ROW_ID]) for f in files]
        t = pa.concat_tables(tables, promote_options="permissive")
        ids = t.filter(pc.is_in(t.column(OP), pa.array([INSERT, DELETE]))).column(ROW_ID)
        return bool(pc.count_distinct(ids, mode="all").as_py() == len(ids))
    except (OSError, KeyError, TypeError, pa.ArrowException):
        return False


def interval_path(path: str) -> str:
    """The interval changes table of the Delta table at `path`."""
    return f"{path.rstrip('/')}/{INTERVAL_CHANGES}"


def write_interval_changes(
    spark: Any, path: str, changes: Any, app_id: str, batch_id: int, unique: bool = False
) -> None:
    """Step 2: append `interval_changes(changes)` to `interval_path(path)` with column
    `__batch` = the micro-batch id, with the same idempotent-write pair as the table's own
    commit (a replayed batch appends nothing). Written before the table's commit: whenever
    a version of the table names batch N, its interval changes are committed."""
    from pyspark.sql import functions as F

    rows = interval_changes(changes, unique).withColumn(BATCH_COL, F.lit(int(batch_id)).cast("long"))
    (
        rows.write.format("delta").mode("append")
        .option("txnAppId", app_id).option("txnVersion", batch_id)
        .option("mergeSchema", "true")
        .save(interval_path(path))
    )


class OutputOwnerError(ValueError):
    """A Delta table's last kwal commit was written by another job (another `txnAppId`)."""


class TxnCache:
    """path -> the last micro-batch id this job committed there (-1: none; absent: not read
    yet), read once per process (from the table's newest commit; -1 without reading when
    there is no table) and kept up to date by the job's own commits. Last round every MERGE
    read the history first (a Spark job over the log each time)."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        self.marks: dict[str, int] = {}  # path -> the watermark its newest version records

    def last_batch(self, spark: Any, path: str, app_id: str) -> int:
        from delta.tables import DeltaTable

        if path not in self.last:
            exists = DeltaTable.isDeltaTable(spark, path)
            self.last[path], mark = _last_txn_version(spark, path, app_id) if exists else (-1, None)
            if mark is not None:
                self.marks[path] = mark
        return self.last[path]


def merge_batch(
    spark: Any,
    path: str,
    changes: Any,
    app_id: str,
    batch_id: int,
    watermark: int,
    cache: TxnCache | None = None,
    has_changes: bool = True,
    has_deletes: bool = True,
) -> bool:
    """Apply one micro-batch's `changes` of one table to the Delta table at `path` (steps in
    the module docstring). Returns False when Delta skipped it (this batch id was committed
    already for `app_id`).

    Cheaper forms of the same commit (same options, same userMetadata): the first batch of a
    table creates it with a plain write of its inserts (a new incarnation has no row a
    delete could match: its deletes met their inserts in the same batch); `has_changes`
    False (the caller knows the batch brought no insert or delete for the table) only moves
    the watermark, with an empty append (no MERGE: no join, no scan of the table);
    `has_deletes` False: an insert-only MERGE (Delta runs it as one anti-join and an append,
    rewriting no file; the anti-join still drops a row the TN re-delivered)."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    cache = cache or TxnCache()
    last = cache.last_batch(spark, path, app_id)
    if last >= batch_id:
        return False
    if watermark <= cache.marks.get(path, -1):
        # no version below (or at) the table's last watermark: the caller's changes are
        # above the table's delta_ts >= that watermark, so there are none. A job resumed
        # from the output alone meets it while it re-reads what a table has already
        # (consumers.spark.job_state, step 3).
        return False
    unique = has_changes and distinct_row_ids(changes)
    if has_changes:
        net = net_changes(changes, has_deletes, unique)
    else:
        net = changes.filter(F.lit(False))
    user_cols = [c for c in net.columns if c != OP]
    meta = json.dumps({WATERMARK_KEY: int(watermark), BATCH_KEY: int(batch_id), APP_KEY: app_id})
    creating = last < 0 and not DeltaTable.isDeltaTable(spark, path)
    if has_changes and has_deletes:
        write_interval_changes(spark, path, changes, app_id, batch_id, unique)
    if creating or not has_changes:
        rows = net.filter(F.col(OP) == INSERT).select(*user_cols)
        writer = (
            rows.write.format("delta").mode("append")
            .option("txnAppId", app_id).option("txnVersion", batch_id)
            .option("userMetadata", meta).option("mergeSchema", "true")
        )
        if creating:
            writer = writer.option("delta.enableChangeDataFeed", "true")
        writer.save(path)
        cache.last[path], cache.marks[path] = batch_id, int(watermark)
        return True
    conf = {
        _TXN_APP: app_id,
        _TXN_VERSION: str(batch_id),
        _USER_METADATA: meta,
        _AUTO_MERGE: "true",
    }
    with _session_conf(spark, conf):
        merge = DeltaTable.forPath(spark, path).alias("t").merge(
            net.alias("s"), f"t.{ROW_ID} = s.{ROW_ID}"
        )
        if has_deletes:
            merge = merge.whenMatchedDelete(condition=F.col(f"s.{OP}") == DELETE)
        merge.whenNotMatchedInsert(
            condition=F.col(f"s.{OP}") == INSERT,
            values={c: F.col(f"s.`{c}`") for c in user_cols},
        ).execute()
    cache.last[path], cache.marks[path] = batch_id, int(watermark)
    return True


def mark_dropped(
    spark: Any, path: str, batch_id: int, drop_ts: int, app_id: str = "", cache: TxnCache | None = None
) -> bool:
    """End the table at `path`: a last version with the property `kwal.dropped_ts` (its
    userMetadata carries the drop ts as the watermark). Idempotent by the property itself:
    a replayed batch finds it set and writes nothing (False). Its userMetadata has the batch id
and the drop ts but no watermark."""
    from delta.tables import DeltaTable

    row = DeltaTable.forPath(spark, path).detail().select("properties").first()
    props = (row[0] if row is not None else None) or {}
    if DROPPED_PROPERTY in props:
        return False
    # no kwal_watermark: the TN has no such table at the drop ts (read_as_of refuses it)
    meta: dict[str, Any] = {"kwal_dropped_ts": int(drop_ts), BATCH_KEY: int(batch_id)}
    if app_id:
        meta[APP_KEY] = app_id
    conf = {_USER_METADATA: json.dumps(meta)}
    with _session_conf(spark, conf):
        spark.sql(
            f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{DROPPED_PROPERTY}' = '{int(drop_ts)}')"
        )
    if cache is not None:
        cache.last[path] = batch_id
    return True


def _last_txn_version(spark: Any, path: str, app_id: str) -> tuple[int, int | None]:
    """The last micro-batch id committed to `path` (-1: none yet) and the watermark that
    commit records (None: none, e.g. `mark_dropped`'s), read from the newest commit's
    userMetadata, which the same commit as the data wrote (with the SetTransaction of
    `txnAppId`/`txnVersion`). Refuses a table whose newest kwal commit names another app
    id: a job whose batch ids restart at 0 on it would have every MERGE skipped
    (OutputOwnerError)."""
    for meta in _history_metadata(spark, path, limit=1):
        if BATCH_KEY in meta:
            owner = meta.get(APP_KEY, app_id)
            if owner != app_id:
                raise OutputOwnerError(
                    f"{path}: written by another job (txnAppId {owner}, up to its batch "
                    f"{meta[BATCH_KEY]}), not this one ({app_id})"
                )
            mark = meta.get(WATERMARK_KEY)
            return int(meta[BATCH_KEY]), None if mark is None else int(mark)
    return -1, None


def _history_metadata(spark: Any, path: str, limit: int | None = None) -> list[dict[str, Any]]:
    """userMetadata of the table's commits, newest first (kwal's, parsed; others as {})."""
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, path).history(limit) if limit else DeltaTable.forPath(
        spark, path
    ).history()
    out = []
    for row in history.select("version", "userMetadata").orderBy("version", ascending=False).collect():
        meta = json.loads(row["userMetadata"]) if row["userMetadata"] else {}
        meta["version"] = int(row["version"])
        out.append(meta)
    return out


class _session_conf:
    """Set SQL confs for one statement and restore them after (Delta reads the idempotency
    and commit-info options from the session)."""

    def __init__(self, spark: Any, conf: dict[str, str]) -> None:
        self.spark, self.conf = spark, conf
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for k, v in self.conf.items():
            self.saved[k] = self.spark.conf.get(k, None)
            self.spark.conf.set(k, v)

    def __exit__(self, *exc: object) -> None:
        for k, v in self.saved.items():
            if v is None:
                self.spark.conf.unset(k)
            else:
                self.spark.conf.set(k, v)


def kwal_versions(spark: Any, path: str) -> list[tuple[int, int, int]]:
    """(Delta version, kwal watermark, micro-batch id) of every version kwal committed with
    a watermark, oldest first."""
    return sorted(
        (m["version"], int(m[WATERMARK_KEY]), int(m.get(BATCH_KEY, -1)))
        for m in _history_metadata(spark, path)
        if WATERMARK_KEY in m
    )


def watermarks(spark: Any, path: str) -> list[tuple[int, int]]:
    """(Delta version, kwal watermark) of every version kwal committed, oldest first."""
    return [(v, w) for v, w, _ in kwal_versions(spark, path)]


def user_columns(columns: Sequence[str]) -> list[str]:
    """The columns of a state row that are the table's own (not kwal's)."""
    return [c for c in columns if c not in (ROW_ID, COMMIT_TS, OP)]
