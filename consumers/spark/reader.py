"""Reading the Spark CN's output (`consumers.spark.job`'s layout): the current state, the
change log, and the snapshot as of a commit ts.

Semantics mirror `consumers.core.cn.CNCore`: the snapshot at ts is the rows inserted with
commit ts <= ts minus the rows (by row id) deleted at or before ts, within the table
incarnation alive at ts (a drop ends it; a create under the same name starts afresh), and,
keyed by primary key, the latest commit ts wins. A table's watermark is the highest commit or
heartbeat ts applied from its topic, capped by the catalog watermark (a dropped table's is
the catalog watermark: its topic has ended); the job's watermark is the minimum over the
catalog and the live tables (unlike `CNCore`, a dropped table does not hold it back
forever). `read_as_of` refuses a ts above the table's watermark.

History retention. The change log is append-only and kept in full, so `read_as_of` answers
any ts from the table's creation up to the watermark, in the incarnation alive at that ts.
Nothing is pruned by the job; to bound it, an operator may delete `_changes/batch=<id>`
directories whose rows are all older than the oldest ts still to be queried AND whose rows
are superseded in `state/` (as-of reads below that ts then become incomplete). Current state
directories are kept for the current and the previous commit only (a reader in flight may
still use the previous one). Progress files: the last 20.
"""


from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from consumers.core.exceptions import (
    AboveWatermarkError,
    BelowHorizonError,
    TableNotFoundError,
)
from consumers.spark.decode import (
    COMMIT_TS,
    DELETE,
    INSERT,
    META_NAMES,
    OP,
    RAW_RECORD,
    ROW_ID,
    spark_type_name,
    union_columns,
)
from consumers.spark.progress import (
    Incarnation,
    Progress,
    TableProgress,
    load_progress,
)
from schemas.wal import ColumnDef, ColumnType, TableSchema


def _committed(output: str | Path) -> Progress:
    prog = load_progress(output)
    if prog is None:
        raise TableNotFoundError(f"no CN job output at {output} yet")
    return prog


def watermark(output: str | Path, table: str | None = None) -> int:
    """The watermark of `table` (or of the whole job) in the committed output; 0 if none."""
    prog = load_progress(output)
    if prog is None:
        return 0
    return prog.watermark(table)


def state_ts(output: str | Path, table: str) -> int:
    """The ts the current state (`read_state`) reflects: every change of the table's topic
    with commit ts <= it is applied (>= `watermark`, which the catalog also caps)."""
    return _committed(output).table(table).applied_ts


def _user_columns(df: Any, schema: TableSchema) -> Any:
    from pyspark.sql import functions as F

    have = set(df.columns)
    cols = [
        F.col(c.name)
        if c.name in have
        else F.lit(None).cast(spark_type_name(c.type)).alias(c.name)
        for c in schema.columns
    ]
    return df.select(*cols).orderBy(schema.primary_key)


def read_state(spark: Any, output: str | Path, table: str) -> Any:
    """The table's current state (at `state_ts`): one row per primary key, user columns in
    schema order, sorted by primary key: the last compacted state merged with the change log
    committed after it. Raises TableNotFoundError for a dropped table."""
    prog = _committed(output)
    tp = prog.table(table)
    inc = tp.current
    if inc is None or inc.drop_ts:
        raise TableNotFoundError(f"table {table} does not exist (dropped or not yet created)")
    base = tp.state_batch if tp.state_create_ts == inc.create_ts else None
    rows = merge_snapshot(spark, output, tp, base, tp.dirs_after(base), inc)
    return _user_columns(rows, inc.schema_at(2**62))


def read_changes(spark: Any, output: str | Path, table: str) -> Any:
    """The table's committed change log (all ops, all incarnations), or None if empty."""
    prog = _committed(output)
    tp = prog.table(table)
    if not tp.change_dirs:
        return None
    cols = union_columns(s for inc in tp.incarnations for _, s in inc.schemas)
    return changes_frame(spark, output, tp.change_dirs, cols)


def read_as_of(spark: Any, output: str | Path, table: str, ts: int) -> Any:
    """The table as of `ts` (<= its watermark), computed from the change log: user columns
    in the schema at ts, sorted by primary key."""
    prog = _committed(output)
    tp = prog.table(table)
    mark = prog.watermark(table)
    if ts > mark:
        raise AboveWatermarkError(f"{table} as of ts {ts} is not available: watermark is {mark}")
    if ts < prog.horizon:
        raise BelowHorizonError(
            f"{table} as of ts {ts} is not available: the job started from the checkpoint at "
            f"ts {prog.horizon} and holds no history before it"
        )
    inc = next((i for i in tp.incarnations if i.alive_at(ts)), None)
    if inc is None:
        raise TableNotFoundError(f"table {table} does not exist at ts {ts}")
    rows = merge_snapshot(spark, output, tp, None, tp.change_dirs, inc, upto_ts=ts)
    return _user_columns(rows, inc.schema_at(ts))


# -- running -----------------------------------------------------------------------------


def table_dir(output: str | Path, table: str) -> Path:
    return Path(output) / table


def _dedupe_by_key(df: Any, pk: str) -> Any:
    """Keyed by primary key: the latest version (commit ts, then row id) wins."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy(pk).orderBy(F.col(COMMIT_TS).desc(), F.col(ROW_ID).desc())
    return df.withColumn("__rank", F.row_number().over(w)).filter("__rank = 1").drop("__rank")


def merge_snapshot(
    spark: Any,
    output: str | Path,
    tp: TableProgress,
    base: int | None,
    tail: Sequence[list[Any]],
    inc: Incarnation,
    upto_ts: int | None = None,
) -> Any:
    """Rows (`__row_id`, `__commit_ts`, user columns) of incarnation `inc`: the state
    written by batch `base` (or nothing) + inserts of change-log dirs `tail` (commit ts <=
    `upto_ts`) - their deletes, one row per primary key (latest commit ts wins)."""
    from pyspark.sql import functions as F

    cols = tp.columns()
    keep = [ROW_ID, COMMIT_TS, *(c.name for c in cols)]
    tdir = table_dir(output, tp.name)
    parts = []
    if base is not None:
        parts.append(_conform(spark.read.parquet(str(tdir / "state" / f"batch={base}")), cols))
    deletes = None
    if tail:
        changes = changes_frame(spark, output, tail, cols)
        live = F.col(COMMIT_TS) >= inc.create_ts
        if upto_ts is not None:
            live = live & (F.col(COMMIT_TS) <= upto_ts)
        parts.append(changes.filter(live & (F.col(OP) == INSERT)))
        deletes = changes.filter(live & (F.col(OP) == DELETE)).select(ROW_ID)
    if not parts:
        return spark.createDataFrame([], _ddl([ColumnDef(0, ROW_ID, ColumnType.INT64),
                                               ColumnDef(0, COMMIT_TS, ColumnType.INT64), *cols]))
    rows = parts[0].select(*keep)
    for part in parts[1:]:
        rows = rows.unionByName(part.select(*keep))
    if deletes is not None:
        rows = rows.join(F.broadcast(deletes), ROW_ID, "left_anti")
    # one row per key (a row id is one key, so this also drops re-delivered inserts)
    return _dedupe_by_key(rows, inc.schema_at(2**62).primary_key)


def _ddl(cols: Sequence[ColumnDef]) -> str:
    return ", ".join(f"`{c.name}` {spark_type_name(c.type)}" for c in cols)


def changes_frame(spark: Any, output: str | Path, dirs: Sequence[list[Any]], cols: Sequence[ColumnDef]) -> Any:
    """The change rows (meta columns + `cols`) of change-log `dirs`, op R left out."""
    from pyspark.sql import functions as F

    by_prefix: dict[str, list[str]] = {}
    for _batch, rel, prefix in dirs:
        by_prefix.setdefault(prefix, []).append(str(Path(output) / rel))
    out = None
    for prefix, paths in by_prefix.items():
        df = spark.read.option("mergeSchema", "true").parquet(*paths)
        have = set(df.columns)
        sel = [F.col(m) for m in META_NAMES]
        for c in cols:
            name = prefix + c.name
            sel.append(
                (F.col(name) if name in have else F.lit(None).cast(spark_type_name(c.type))).alias(c.name)
            )
        df = df.select(*sel).filter(F.col(OP) != RAW_RECORD)
        out = df if out is None else out.unionByName(df)
    return out


def _conform(df: Any, cols: Sequence[ColumnDef]) -> Any:
    """`df` with every column of `cols` (added as typed nulls where missing: alter table)."""
    from pyspark.sql import functions as F

    have = set(df.columns)
    for c in cols:
        if c.name not in have:
            df = df.withColumn(c.name, F.lit(None).cast(spark_type_name(c.type)))
    return df
