"""The Spark Structured Streaming CN job: logtail topics -> readable, versioned Parquet state.

    kwal cn spark --tables db.t1,db.t2 --output PATH [--trigger 1s|available-now]
    spark-submit consumers/spark/job.py --tables db.t1 --output PATH --bootstrap host:port

One streaming query reads the catalog topic and the tables' logtail topics through
`consumers.spark.source.kafka_stream` (startingOffsets earliest) and, per micro-batch
(`foreachBatch`, `BatchWriter.process_batch`):

1. one pass over the batch's records on the executors, written to the change log,
   partitioned by table: `consumers.spark.decode.decode_all` (Avro envelope + Arrow IPC ->
   typed change rows of every table side by side in one wide schema, catalog records kept
   whole). The kwal source runs it where it reads the records (its `decode` option, with
   the plan made when the query starts); over the built-in Kafka source it runs in a
   `mapInArrow` with the plan of the batch;
2. on the driver (pyarrow over the files just written, no Spark job): the catalog records
   are applied (tables' incarnations: create ts, drop ts, schema history; the catalog
   watermark), and each table's watermark, block metas and checkpoint are folded in;
3. each table's current state is compacted from its previous state and the change log
   after it, at most every `compact_interval_s` (readers merge the tail in between);
4. a progress file records the batch id, the watermarks, the catalog and where everything
   is; it is the commit.

The decoder needs each table's schema. It comes from the committed catalog, plus hints read
from the catalog topic when the query starts (`catalog_hints`). Records the plan cannot
decode -- of a table created after the plan was made, or carrying a column an ALTER TABLE
added since -- are kept whole (`__op` R) and decoded, once the catalog records that explain
them have been applied (in the same batch or a later one), into
`<db>.<table>/redecoded/batch=<id>/`; until then they hold the table's watermark below
them. A table created after the query started is therefore decoded in a second step of
every batch until the query is restarted.

Layout under `output/`:

    _progress/<batch id>.json                   the commit record: batch id, catalog,
                                                watermarks, table numbers, directories
    _changes/batch=<id>/__table=<n>/            the change log (Parquet) of table number n:
                                                every insert and delete with its row id,
                                                commit ts, LSN and Kafka offset, and one row
                                                per heartbeat / block meta / checkpoint;
                                                user columns named t<n>__<column>
    _changes/batch=<id>/__table=-1/             the batch's catalog records (bytes)
    <db>.<table>/state/batch=<id>/              the compacted current state (Parquet):
                                                __row_id, __commit_ts, user columns, one row
                                                per primary key
    <db>.<table>/redecoded/batch=<id>/          late-decoded records (see above)
    <db>.<table>/bootstrap/                     a job started from a checkpoint: the table's
                                                rows at its ts (batch -1), one file per object
    _progress/bootstrap.json                    that start's commit (horizon, start offsets)
    _checkpoint/                                Spark's checkpointLocation (default)

Semantics mirror `consumers.core.cn.CNCore`: the snapshot at ts is the rows inserted with
commit ts <= ts minus the rows (by row id) deleted at or before ts, within the table
incarnation alive at ts (a drop ends it; a create under the same name starts afresh), and,
keyed by primary key, the latest commit ts wins. A table's watermark is the highest commit or
heartbeat ts applied from its topic, capped by the catalog watermark (a dropped table's is
the catalog watermark: its topic has ended); the job's watermark is the minimum over the
catalog and the live tables (unlike `CNCore`, a dropped table does not hold it back
forever). `read_as_of` refuses a ts above the table's watermark.

Exactly-once across restarts. Spark writes the batch's offsets to the checkpointLocation
before running it, so a replayed batch id carries the same records. Every file a batch writes
lives under a path named by its batch id and is written with mode overwrite, so a replay
replaces, never adds; the progress file `_progress/<id>.json` is written last (atomic
rename) and is the batch's commit: `process_batch` skips a batch id at or below the last
progress file (it committed, Spark had not yet recorded it), and readers only look at the
directories the last progress file lists (a crash mid-batch leaves nothing visible). Kafka
records re-delivered by the TN (same LSN, later offset) are harmless: a row id is inserted
and deleted at most once, so readers de-duplicate by (row id, op).

History retention. The change log is append-only and kept in full, so `read_as_of` answers
any ts from the table's creation up to the watermark, in the incarnation alive at that ts.
Nothing is pruned by the job; to bound it, an operator may delete `_changes/batch=<id>`
directories whose rows are all older than the oldest ts still to be queried AND whose rows
are superseded in `state/` (as-of reads below that ts then become incomplete). Current state
directories are kept for the current and the previous commit only (a reader in flight may
still use the previous one). Progress files: the last 20.

Block metas and checkpoints. A CN drops in-memory rows of a block once the block is in
object storage (seed 001, memory clean-up); here state is already durable Parquet, and
every row of a flushed block was delivered as an insert before its BlockMeta (the logtail is
in commit order), so a BlockMeta needs no action: it is recorded in the change log (`__op` =
B, the meta as JSON in `__meta`) and advances the watermark.

Starting from a checkpoint (pull, seed 001). A new job reads its topics from their first
records while they have them (full history); once the TN has truncated one (it does after
checkpoints where the broker has DeleteRecords), it starts from the newest checkpoint in the
object store instead (`start_query`'s `from_checkpoint`, `consumers.spark.bootstrap`): the
tables' rows at that ts t1 become change-log batch -1, the topics are read from the
manifest's offsets, records at or below t1 are dropped when decoded, and reads below t1
raise BelowHorizonError.

Memory. Laptop (local[2]): `spark.driver.memory=1g` (set before the first session, e.g.
`--driver-memory 1g` or `SPARK_DRIVER_MEMORY`), `spark.sql.shuffle.partitions=2`,
`--max-records-per-trigger 200000` bounds a micro-batch (a batch streams through one
decode pass and is not cached; the driver holds only the batch's catalog records and one
small column set per table; compaction shuffles one table's state). Cluster: driver 2-4g (catalog and progress are small),
executors 4-8g with 2-4 cores each, `spark.sql.shuffle.partitions` about 2x the cores,
`spark.executor.memoryOverhead` >= 1g (Python workers decode Arrow outside the JVM heap),
`maxRecordsPerTrigger` sized so one task's records (`maxRecordsPerPartition`, default
50,000 per Spark partition; a micro-batch is shared by at least `defaultParallelism` tasks
once it has 1,000 records per task, and small topics share a task) decode comfortably in a
Python worker, and an
output path on a filesystem every node and the driver share (the driver writes progress
files and reads each batch's change-log files with plain file I/O: a local path, NFS or a
FUSE mount; not s3a:// yet).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from consumers.core.exceptions import (
    AboveWatermarkError,
    BelowHorizonError,
    BootstrapError,
    SchemaMismatchError,
    TableNotFoundError,
    TruncatedLogtailError,
)
from consumers.spark.arguments import FROM_CHECKPOINT, add_job_arguments
from consumers.spark.bootstrap import bootstrap_output
from consumers.spark.decode import (
    BLOCK,
    CATALOG_INDEX,
    CHECKPOINT,
    COMMIT_TS,
    DELETE,
    INSERT,
    META,
    META_NAMES,
    OFFSET,
    OP,
    RAW,
    RAW_RECORD,
    ROW_ID,
    TABLE,
    DecodePlan,
    change_ddl,
    change_schema,
    decode_all,
    decode_changes,
    spark_type_name,
    union_columns,
    wide_ddl,
    wide_name,
)
from consumers.spark.progress import (
    CHANGES,
    Incarnation,
    Progress,
    TableProgress,
    apply_catalog,
    load_progress,
    write_progress,
)
from consumers.spark.resume import discard_output, lost_positions, resume_positions
from consumers.spark.session import build_session
from infra.objectstore import ObjectStore
from schemas.logtail import decode_logtail
from schemas.wal import ColumnDef, ColumnType, TableSchema

log = logging.getLogger(__name__)

# `kwal cn spark` starts a query that fell behind the truncation again at most this many
# times in a row without a batch committed in between (the truncation outruns it).
MAX_RESTARTS = 3


# -- the batch ---------------------------------------------------------------------------


def _table_dir(output: str | Path, table: str) -> Path:
    return Path(output) / table


def _decoder(ddl_cols: Sequence[ColumnDef]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    target = change_schema(ddl_cols)

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return decode_changes(batches, target)

    return decode


def _dedupe_by_key(df: Any, pk: str) -> Any:
    """Keyed by primary key: the latest version (commit ts, then row id) wins."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy(pk).orderBy(F.col(COMMIT_TS).desc(), F.col(ROW_ID).desc())
    return df.withColumn("__rank", F.row_number().over(w)).filter("__rank = 1").drop("__rank")


class BatchWriter:
    """`foreachBatch` target: applies one micro-batch to the state under `output`.

    `hints`: table -> schemas known from the catalog topic before the query started
    (`catalog_hints`), so that the batch that carries a table's create_table can decode the
    table's records in the same pass.

    `decoded`: the batches arrive decoded by the source with this plan (`source_plan`), not
    as raw Kafka records."""

    def __init__(
        self,
        output: str | Path,
        catalog_topic: str,
        tables: dict[str, str],
        compact_interval_s: float = 10.0,
        hints: dict[str, list[TableSchema]] | None = None,
        decoded: DecodePlan | None = None,
    ) -> None:
        self.output = str(output)
        self.compact_interval_s = compact_interval_s
        self.catalog_topic = catalog_topic
        self.tables = tables  # db.table -> topic
        self.hints = hints or {}
        self.decoded = decoded
        self.batches_applied = 0
        self.batches_skipped = 0
        self.timings: dict[str, float] = {}  # seconds spent per step, over all batches
        self._t = time.perf_counter()

    def _lap(self, step: str) -> None:
        now = time.perf_counter()
        self.timings[step] = round(self.timings.get(step, 0.0) + now - self._t, 3)
        self._t = now

    def __call__(self, df: Any, batch_id: int) -> None:
        self.process_batch(df, batch_id)

    def _fresh_progress(self) -> Progress:
        prog = load_progress(self.output) or Progress(catalog_topic=self.catalog_topic)
        for name, topic in self.tables.items():
            if name not in prog.tables:
                used = {tp.index for tp in prog.tables.values()}
                index = next(i for i in range(len(used) + 1) if i not in used)
                prog.tables[name] = TableProgress(name, topic, index=index)
        return prog

    def _topics(self, prog: Progress) -> dict[str, int]:
        """topic -> table index in the wide schema (`CATALOG_INDEX` for the catalog)."""
        topics = {self.catalog_topic: CATALOG_INDEX}
        topics.update({prog.tables[n].topic: prog.tables[n].index for n in self.tables})
        return topics

    def _plan(self, prog: Progress) -> DecodePlan:
        """How the next batch decodes: table numbers, each table's columns from the committed
        catalog plus the hints, the horizon."""
        tables: dict[int, list[ColumnDef] | None] = {}
        for name in self.tables:
            tp = prog.tables[name]
            schemas = [s for _, s in tp.current.schemas] if tp.current else []
            schemas += self.hints.get(name, [])
            tables[tp.index] = union_columns(schemas) if schemas else None
        return DecodePlan(self._topics(prog), tables, prog.horizon)

    def source_plan(self) -> DecodePlan:
        """The plan for a source that decodes (its `decode` option is `to_json()`), as the
        next batch would use it."""
        return self._plan(self._fresh_progress())

    def _pass(self, df: Any, bdir: Path, prog: Progress) -> None:
        """Decode every record of the batch (one pass, on the executors) into the change log
        `_changes/batch=<id>/__table=<index>/`, replacing what a failed attempt left. Records
        the plan cannot decode are kept whole (R, K): see `decode_all`."""
        if self.decoded is not None:
            source, topics = self.decoded, self._topics(prog)
            if (source.topics, source.horizon) != (topics, prog.horizon):
                raise RuntimeError(
                    f"the source decodes with table numbers {source.topics} and horizon "
                    f"{source.horizon}, the job's progress has {topics} and {prog.horizon}: "
                    "restart the query"
                )
            rows = df
        else:
            plan = self._plan(prog)

            def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                return decode_all(batches, plan)

            rows = df.select("topic", "offset", "value").mapInArrow(decode, wide_ddl(plan.tables))
        rows.write.partitionBy(TABLE).mode("overwrite").parquet(str(bdir))

    def process_batch(self, df: Any, batch_id: int) -> None:
        self._t = time.perf_counter()
        prog = self._fresh_progress()
        if prog.batch_id >= batch_id:
            self.batches_skipped += 1  # committed before a crash; Spark replays it: no-op
            return
        spark = df.sparkSession
        bdir = Path(self.output) / CHANGES / f"batch={batch_id}"
        self._pass(df, bdir, prog)
        self._lap("decode+write")
        catalog = _read_local(bdir / f"{TABLE}={CATALOG_INDEX}", [OFFSET, RAW])
        for _, value in sorted(
            zip(catalog.column(OFFSET).to_pylist(), catalog.column(RAW).to_pylist(), strict=True)
        ):
            apply_catalog(prog, decode_logtail(value))
        stats = {n: _read_local(bdir / f"{TABLE}={prog.tables[n].index}", _STAT_COLS) for n in self.tables}
        self._lap("stats")
        old_states: list[Path] = []
        for name in self.tables:
            self._apply_table(
                spark, batch_id, prog.tables[name], stats[name], prog.catalog_watermark, old_states
            )
        prog.batch_id = batch_id
        prog.committed_at = time.time()
        write_progress(self.output, prog)  # the commit
        for path in old_states:
            shutil.rmtree(path, ignore_errors=True)
        self.batches_applied += 1
        self._lap("commit")
        if os.environ.get("KWAL_SPARK_TIMINGS"):
            print(f"[kwal cn spark] batch {batch_id}: {self.timings}", file=sys.stderr, flush=True)

    def _apply_table(
        self,
        spark: Any,
        batch_id: int,
        tp: TableProgress,
        stats: pa.Table,
        catalog_watermark: int,
        old_states: list[Path],
    ) -> None:
        from pyspark.sql import functions as F

        changed = 0
        if stats.num_rows:
            rel = f"{CHANGES}/batch={batch_id}/{TABLE}={tp.index}"
            tp.change_dirs.append([batch_id, rel, wide_name(tp.index, "")])
            if _has_raw(stats):
                _hold(tp, batch_id, stats)  # no create_table or alter seen yet: decode later
            changed += _absorb(tp, stats)
        if tp.pending and _decodable(tp, catalog_watermark):
            paths = [
                str(Path(self.output) / CHANGES / f"batch={b}" / f"{TABLE}={tp.index}")
                for b in tp.pending
            ]
            records = (
                spark.read.parquet(*paths)
                .filter(F.col(OP) == RAW_RECORD)
                .select(F.col(RAW).alias("value"), F.col(OFFSET).alias("offset"))
            )
            cols = tp.columns()
            rdir = _table_dir(self.output, tp.name) / "redecoded" / f"batch={batch_id}"
            records.mapInArrow(_decoder(cols), change_ddl(cols)).write.mode("overwrite").parquet(
                str(rdir)
            )
            tp.change_dirs.append([batch_id, str(rdir.relative_to(self.output)), ""])
            tp.pending, tp.pending_columns, tp.pending_ts = [], [], (0, 0)
            changed += _absorb(tp, _read_local(rdir, _STAT_COLS))
        self._lap("redecode")
        if tp.current is not None:
            self._compact(spark, batch_id, tp, changed, old_states)
            self._lap("compact")

    def _compact(
        self,
        spark: Any,
        batch_id: int,
        tp: TableProgress,
        changed: int,
        old_states: list[Path],
    ) -> None:
        """state/batch=<id> = the previous state merged with the change log after it, when
        `compact_interval_s` has passed since the last compaction (or since the incarnation
        began) and no record of the table waits undecoded; readers merge the change-log tail
        themselves in between."""
        inc = tp.current
        assert inc is not None
        tdir = _table_dir(self.output, tp.name)
        same_life = tp.state_batch is not None and tp.state_create_ts == inc.create_ts
        if inc.drop_ts:
            if tp.state_batch is not None:
                old_states.append(tdir / "state" / f"batch={tp.state_batch}")
            tp.state_batch = None
            tp.state_create_ts = inc.create_ts
            tp.compacted_at = 0.0
            return
        if not same_life and tp.state_create_ts != inc.create_ts:
            # a new incarnation (first batch of a table, or created again): state starts empty
            if tp.state_batch is not None:
                old_states.append(tdir / "state" / f"batch={tp.state_batch}")
            tp.state_batch = None
            tp.state_create_ts = inc.create_ts
            tp.uncompacted = 0
            tp.compacted_at = time.time()
        tp.uncompacted += changed
        if tp.uncompacted == 0 or time.time() - tp.compacted_at < self.compact_interval_s:
            return
        if tp.pending:
            # undecoded records may be older than changes already decoded (a delete of a
            # row they insert): a state compacted now would let them win when decoded
            return
        base = tp.state_batch
        state = _merge(spark, self.output, tp, base, tp.dirs_after(base, batch_id), inc)
        state.write.mode("overwrite").parquet(str(tdir / "state" / f"batch={batch_id}"))
        if tp.state_batch is not None and tp.state_batch != batch_id:
            # keep the previous state one more commit (a reader may be using it)
            old_states.extend(
                p
                for p in (tdir / "state").glob("batch=*")
                if p.name not in (f"batch={tp.state_batch}", f"batch={batch_id}")
            )
        tp.state_batch = batch_id
        tp.state_create_ts = inc.create_ts
        tp.uncompacted = 0
        tp.compacted_at = time.time()


def _merge(
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
    tdir = _table_dir(output, tp.name)
    parts = []
    if base is not None:
        parts.append(_conform(spark.read.parquet(str(tdir / "state" / f"batch={base}")), cols))
    deletes = None
    if tail:
        changes = _changes_df(spark, output, tail, cols)
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


_STAT_COLS = [OP, COMMIT_TS, META]


def _has_raw(stats: pa.Table) -> bool:
    return stats.num_rows > 0 and bool(pc.any(pc.equal(stats.column(OP), RAW_RECORD)).as_py())


def _hold(tp: TableProgress, batch_id: int, stats: pa.Table) -> None:
    """Note a batch's undecoded records (R) in `tp`: the batch, the columns they carry (their
    `__meta`) and the span of their commit ts. They hold the table's watermark below them
    (`applied_ts`); `_absorb` skips them."""
    raw = stats.filter(pc.equal(stats.column(OP), RAW_RECORD))
    columns = set(tp.pending_columns)
    for meta in raw.column(META).to_pylist():
        columns.update(json.loads(meta) if meta else [])
    span = pc.min_max(raw.column(COMMIT_TS))
    lo, hi = int(span["min"].as_py()), int(span["max"].as_py())
    if tp.pending:
        lo, hi = min(lo, tp.pending_ts[0]), max(hi, tp.pending_ts[1])
    tp.pending.append(batch_id)
    tp.pending_columns = sorted(columns)
    tp.pending_ts = (lo, hi)


def _decodable(tp: TableProgress, catalog_watermark: int) -> bool:
    """Whether `tp`'s undecoded records can be decoded now: the table exists and its schemas
    have every column they carry. Once the catalog topic is past their ts, no ALTER TABLE can
    still bring a missing column: SchemaMismatchError (the records would otherwise hold the
    watermark, unseen, forever)."""
    if tp.current is None:
        return False
    missing = set(tp.pending_columns) - {c.name for c in tp.columns()}
    if missing and catalog_watermark >= tp.pending_ts[1]:
        raise SchemaMismatchError(
            f"{tp.name}: records up to ts {tp.pending_ts[1]} carry columns {sorted(missing)}, "
            f"which no schema the catalog topic declared (up to ts {catalog_watermark}) has"
        )
    return not missing


def _absorb(tp: TableProgress, stats: pa.Table) -> int:
    """Fold a batch's decoded control rows into `tp` (watermark, block metas, checkpoint);
    returns its insert + delete count. Undecoded records (R) do not move the watermark.
    Vectorised: a batch carries one stats row per change (200k rows took 0.14 s row by
    row); block metas and checkpoints are few and are walked one by one."""
    ops = stats.column(OP)
    decoded = stats.filter(pc.not_equal(ops, RAW_RECORD))
    if decoded.num_rows:
        tp.watermark = max(tp.watermark, int(pc.max(decoded.column(COMMIT_TS)).as_py()))
    changed = int(pc.sum(pc.is_in(ops, pa.array([INSERT, DELETE]))).as_py() or 0)
    control = decoded.filter(pc.is_in(decoded.column(OP), pa.array([BLOCK, CHECKPOINT])))
    for op, meta in zip(control.column(OP).to_pylist(), control.column(META).to_pylist(), strict=True):
        if op == BLOCK:
            tp.blocks[str(json.loads(meta)["block_id"])] = meta
        else:
            tp.last_checkpoint = meta
    tp.change_rows += changed
    return changed


def _changes_df(spark: Any, output: str | Path, dirs: Sequence[list[Any]], cols: Sequence[ColumnDef]) -> Any:
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


def _read_local(path: Path, columns: list[str]) -> pa.Table:
    """Columns of the Parquet files Spark wrote under `path` (a local directory)."""
    import pyarrow.parquet as pq

    files = sorted(p for p in path.glob("*.parquet") if not p.name.startswith((".", "_")))
    tables = [pq.read_table(f, columns=columns) for f in files]
    tables = [t for t in tables if t.num_rows]
    if not tables:
        types = {OP: pa.string(), COMMIT_TS: pa.int64(), META: pa.string(), OFFSET: pa.int64(),
                 RAW: pa.binary()}
        return pa.table({c: pa.array([], types[c]) for c in columns})
    return pa.concat_tables(tables, promote_options="permissive")


def _conform(df: Any, cols: Sequence[ColumnDef]) -> Any:
    """`df` with every column of `cols` (added as typed nulls where missing: alter table)."""
    from pyspark.sql import functions as F

    have = set(df.columns)
    for c in cols:
        if c.name not in have:
            df = df.withColumn(c.name, F.lit(None).cast(spark_type_name(c.type)))
    return df


# -- readers -----------------------------------------------------------------------------


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
    rows = _merge(spark, output, tp, base, tp.dirs_after(base), inc)
    return _user_columns(rows, inc.schema_at(2**62))


def read_changes(spark: Any, output: str | Path, table: str) -> Any:
    """The table's committed change log (all ops, all incarnations), or None if empty."""
    prog = _committed(output)
    tp = prog.table(table)
    if not tp.change_dirs:
        return None
    cols = union_columns(s for inc in tp.incarnations for _, s in inc.schemas)
    return _changes_df(spark, output, tp.change_dirs, cols)


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
    rows = _merge(spark, output, tp, None, tp.change_dirs, inc, upto_ts=ts)
    return _user_columns(rows, inc.schema_at(ts))


# -- running -----------------------------------------------------------------------------


def parse_tables(text: str | Sequence[str]) -> list[str]:
    items = text.split(",") if isinstance(text, str) else list(text)
    tables = [t.strip() for t in items if t.strip()]
    for t in tables:
        db, _, name = t.partition(".")
        if not db or not name:
            raise ValueError(f"a table is db.table, got {t!r}")
    if not tables:
        raise ValueError("no tables given")
    return tables


def start_query(
    spark: Any,
    bootstrap: str,
    catalog_topic: str,
    table_topics: dict[str, str],
    output: str | Path,
    checkpoint: str | Path | None = None,
    trigger: str = "1s",
    max_records_per_trigger: int | None = None,
    source_options: dict[str, Any] | None = None,
    compact_interval_s: float = 10.0,
    store: ObjectStore | None = None,
    from_checkpoint: str = "auto",
) -> Any:
    """Start the CN query (returns the StreamingQuery). `trigger`: "available-now", or a
    processing-time interval ("1s", "500 milliseconds").

    A job with no progress under `output` yet starts, by `from_checkpoint`:
    - "never": from its topics' first records (full history); refused with
      TruncatedLogtailError when a topic no longer starts at offset 0;
    - "always": from the newest checkpoint in `store` (`consumers.spark.bootstrap`);
    - "auto" (default): from the first records while every topic still has them, else
      from the checkpoint (refused as for "never" when there is no `store`).
    A table added to an existing job is read from its topic's first record (refused when
    that was truncated; a job started from a checkpoint takes no new table: BootstrapError,
    as when the checkpoint cannot be used).

    A job with progress whose next micro-batch needs records the broker deleted (it was
    stopped or fell behind while the TN truncated past it, or retention did:
    `consumers.spark.resume`) cannot continue: unless `from_checkpoint` is "never" or there
    is no `store` (TruncatedLogtailError naming the tables and offsets lost), its output
    and Spark checkpoint are discarded and it starts again from the newest checkpoint, as
    a new job would (a new horizon: reads below it are refused from then on)."""
    from consumers.spark.source import kafka_stream

    if from_checkpoint not in FROM_CHECKPOINT:
        raise ValueError(f"from_checkpoint is one of {FROM_CHECKPOINT}, got {from_checkpoint!r}")
    options: dict[str, Any] = {
        "startingOffsets": "earliest",
        "maxRecordsPerPartition": 50000,
        "minPartitions": _parallelism(spark),
        "kafka.fetch.wait.max.ms": 50,
        "kafka.isolation.level": "read_committed",  # a fenced TN's records are aborted
    }
    if max_records_per_trigger:
        options["maxRecordsPerTrigger"] = max_records_per_trigger
    options.update(source_options or {})
    topics = [catalog_topic, *table_topics.values()]
    ckpt = Path(checkpoint or Path(output) / "_checkpoint")
    names = _topic_names(catalog_topic, table_topics)
    prog = load_progress(output)
    if prog is not None:
        lost = lost_records(bootstrap, output, ckpt, table_topics, catalog_topic, options)
        if lost and (store is None or from_checkpoint == "never"):
            raise TruncatedLogtailError(_lost_message(lost, names, (
                "start it again from the newest checkpoint (--from-checkpoint auto or always, "
                "with the object store the TN checkpoints to)"
            )))
        if lost:
            # fell behind the truncation: the job's state cannot be continued past the gap
            log.warning("Spark CN %s: %s; starting again from the newest checkpoint", output,
                        _lost_where(lost, names))
            discard_output(output, ckpt, sorted(set(prog.tables) | set(table_topics)))
            prog = None
    if prog is None:
        lows = low_watermarks(bootstrap, topics, options)
        truncated = {t: (0, low) for t, low in lows.items() if low > 0}
        pull = truncated and from_checkpoint == "auto" and store is not None
        if from_checkpoint == "always" or pull:
            if store is None:
                raise BootstrapError("starting from a checkpoint needs the object store")
            # offsets of an attempt that never committed are not the checkpoint's
            shutil.rmtree(ckpt, ignore_errors=True)
            prog = bootstrap_output(store, output, catalog_topic, table_topics, lows)
        elif truncated:
            raise TruncatedLogtailError(_lost_message(truncated, names, (
                "start from the newest checkpoint (--from-checkpoint auto or always)"
                if store is not None
                else "give the job the object store the TN checkpoints to, to start from the "
                "newest checkpoint (kwal cn spark does, unless --from-checkpoint never)"
            )))
    else:
        new = [n for n in table_topics if n not in prog.tables]
        if new and prog.horizon:
            raise BootstrapError(
                f"{', '.join(new)}: this job started from the checkpoint at ts {prog.horizon} "
                "and holds no rows of other tables before it; follow them with a job of their own"
            )
        lows = low_watermarks(bootstrap, [table_topics[n] for n in new], options)
        truncated = {t: (0, low) for t, low in lows.items() if low > 0}
        if truncated:
            raise TruncatedLogtailError(_lost_message(truncated, names, (
                "a table added to a job is read from its topic's first record: follow it with "
                "a job of its own, which can start from the checkpoint"
            )))
    if prog is not None and prog.start_offsets:
        # started from a checkpoint: where Spark starts while its checkpointLocation is empty
        starts = {t: {"0": -2} for t in topics}
        starts.update({t: {"0": o} for t, o in prog.start_offsets.items() if t in starts})
        options["startingOffsets"] = json.dumps(starts, sort_keys=True)
    hints = catalog_hints(bootstrap, catalog_topic, list(table_topics), options)
    writer = BatchWriter(output, catalog_topic, table_topics, compact_interval_s, hints)
    plan = writer.source_plan()
    df = kafka_stream(spark, bootstrap, topics, decode=plan.to_json(), **options)
    writer.decoded = plan if TABLE in df.columns else None  # the built-in source does not decode
    w = df.writeStream.foreachBatch(writer).option("checkpointLocation", str(ckpt)).queryName(
        f"kwal-cn-{abs(hash(str(output))) % 10**8}"
    )
    if trigger in ("available-now", "availableNow", "once"):
        w = w.trigger(availableNow=True)
    else:
        w = w.trigger(processingTime=_interval(trigger))
    return w.start()


def _parallelism(spark: Any) -> int:
    """The cores the session's tasks may use (`defaultParallelism`): a micro-batch's records
    are shared by that many tasks when there are enough (`minPartitions`); 1 where the
    session has no SparkContext (Spark Connect)."""
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:
        return 1


def low_watermarks(bootstrap: str, topics: Sequence[str], options: dict[str, Any]) -> dict[str, int]:
    """topic -> the first offset its partition 0 still has (the logtail topics have one
    partition; > 0 once truncated after a checkpoint, or by retention)."""
    from consumers.spark.kafka_io import EndFinder
    from consumers.spark.source import SourceOptions

    if not topics:
        return {}
    opts = SourceOptions.parse({**options, "bootstrap": bootstrap, "topics": ",".join(topics)}, True)
    finder = EndFinder(opts.kafka, opts.poll_timeout_s)
    try:
        watermarks = finder.watermarks(finder.partitions(topics))
    finally:
        finder.close()
    return {t: low for (t, p), (low, _high) in sorted(watermarks.items()) if p == 0}


def lost_records(
    bootstrap: str,
    output: str | Path,
    checkpoint: str | Path | None,
    table_topics: dict[str, str],
    catalog_topic: str,
    options: dict[str, Any],
) -> dict[str, tuple[int, int]]:
    """topic -> [position, log start) for each topic whose records the job's next
    micro-batch needs and the broker deleted (`consumers.spark.resume`); {} for a job
    with no progress yet."""
    prog = load_progress(output)
    if prog is None:
        return {}
    topics = [catalog_topic, *table_topics.values()]
    ckpt = checkpoint or Path(output) / "_checkpoint"
    return lost_positions(
        resume_positions(ckpt, prog, topics), low_watermarks(bootstrap, topics, options)
    )


def _topic_names(catalog_topic: str, table_topics: dict[str, str]) -> dict[str, str]:
    """topic -> what it carries, for messages ("table db.a", "the catalog")."""
    return {catalog_topic: "the catalog", **{t: f"table {n}" for n, t in table_topics.items()}}


def _lost_where(lost: dict[str, tuple[int, int]], names: dict[str, str]) -> str:
    """The records a job needs and the broker deleted: table, topic, offsets [from, to)."""
    return "; ".join(
        f"{names.get(t, 'topic')}: {t}[0] starts at offset {low}, records [{o}, {low}) deleted"
        for t, (o, low) in sorted(lost.items())
    )


def _lost_message(lost: dict[str, tuple[int, int]], names: dict[str, str], fix: str) -> str:
    return (
        f"{_lost_where(lost, names)} (the TN truncates logtail topics after checkpoints, or "
        f"retention did). Reading from there would show tables without the rows in the gap: "
        f"{fix}."
    )


def catalog_hints(
    bootstrap: str, catalog_topic: str, tables: list[str], options: dict[str, Any]
) -> dict[str, list[TableSchema]]:
    """Schemas of `tables` in the catalog topic now: decoding hints only; the job's catalog
    state is built from the stream's own catalog records. Read on the driver with the
    source's batch reader (`read_now`), not as a Spark job: a job costs ~0.5 s of scheduling
    for a topic this small."""
    from consumers.spark.source import read_now

    read_options = {"bootstrap": bootstrap, "topics": catalog_topic, "startingOffsets": "earliest"}
    for key, value in options.items():
        if key.lower().startswith("kafka.") or key.lower() == "polltimeoutms":
            read_options[key] = str(value)
    records: list[tuple[int, bytes]] = []
    for batch in read_now(read_options):
        offsets = batch.column("offset").to_pylist()
        values = batch.column("value").to_pylist()
        records.extend((int(o), bytes(v or b"")) for o, v in zip(offsets, values, strict=True))
    scratch = Progress(catalog_topic=catalog_topic)
    for name in tables:
        scratch.tables[name] = TableProgress(name, "")
    for _, value in sorted(records):
        apply_catalog(scratch, decode_logtail(value))
    return {
        name: [s for inc in tp.incarnations for _, s in inc.schemas]
        for name, tp in scratch.tables.items()
        if tp.incarnations
    }


def _interval(text: str) -> str:
    t = text.strip()
    if t.endswith("ms") and t[:-2].strip().isdigit():
        return f"{t[:-2].strip()} milliseconds"
    if t.endswith("s") and t[:-1].strip().replace(".", "", 1).isdigit():
        return f"{t[:-1].strip()} seconds"
    return t


def run(args: Any, cfg: Any) -> int:
    """`kwal cn spark`: args.tables "db.t1,db.t2", args.output PATH, args.trigger "1s" |
    "available-now"; optional args.checkpoint, args.max_records_per_trigger, args.master,
    args.compact_interval (seconds, default 10), args.timeout (seconds, 0 = forever),
    args.from_checkpoint (auto | always | never, see `start_query`; the object store is
    cfg's). Exit code 0, 1 when the query failed or cannot start (a truncated topic, an
    unusable checkpoint), 2 for bad arguments."""
    from infra.objectstore import open_store

    try:
        tables = parse_tables(args.tables)
    except ValueError as e:
        print(f"kwal cn spark: {e}", file=sys.stderr)
        return 2
    from_checkpoint = str(getattr(args, "from_checkpoint", None) or "auto")
    if from_checkpoint not in FROM_CHECKPOINT:
        print(f"kwal cn spark: --from-checkpoint is one of {', '.join(FROM_CHECKPOINT)}",
              file=sys.stderr)
        return 2
    output = str(args.output)
    trigger = str(getattr(args, "trigger", "1s") or "1s")
    spark = build_session(master=getattr(args, "master", None))
    topics = {t: cfg.topics.logtail(*t.split(".", 1)) for t in tables}
    kafka_opts = {f"kafka.{k}": v for k, v in cfg.kafka.items() if k != "bootstrap.servers"}
    store = None if from_checkpoint == "never" else open_store(cfg.objectstore)
    checkpoint = getattr(args, "checkpoint", None)
    timeout = float(getattr(args, "timeout", 0) or 0)
    deadline = time.monotonic() + timeout if timeout else None
    restarts = 0  # in a row, without a batch committed in between
    while True:
        try:
            q = start_query(
                spark,
                cfg.bootstrap,
                cfg.topics.catalog,
                topics,
                output,
                checkpoint=checkpoint,
                trigger=trigger,
                max_records_per_trigger=getattr(args, "max_records_per_trigger", None),
                source_options=kafka_opts,
                compact_interval_s=float(getattr(args, "compact_interval", None) or 10.0),
                store=store,
                from_checkpoint=from_checkpoint,
            )
        except (TruncatedLogtailError, BootstrapError) as e:
            print(f"kwal cn spark: cannot start: {e}", file=sys.stderr)
            return 1
        prog = load_progress(output)
        if prog is not None and prog.horizon and prog.batch_id < 0:
            print(f"kwal cn spark: started from the checkpoint at ts {prog.horizon}",
                  file=sys.stderr, flush=True)
        print(f"kwal cn spark: following {', '.join(tables)} into {output} (trigger {trigger})",
              file=sys.stderr, flush=True)
        try:
            if deadline is None:
                q.awaitTermination()
            elif not q.awaitTermination(max(0.0, deadline - time.monotonic())):
                q.stop()
        except KeyboardInterrupt:
            q.stop()
        except Exception:  # noqa: BLE001 - a failed query raises here; its error is read below
            pass
        error = q.exception()
        if error is None:
            break
        prog = load_progress(output)
        restarts = 0 if prog is not None and prog.batch_id >= 0 else restarts + 1
        lost = lost_records(cfg.bootstrap, output, checkpoint, topics, cfg.topics.catalog, kafka_opts)
        if store is None or not lost or restarts > MAX_RESTARTS:
            print(f"kwal cn spark: the query failed: {error}", file=sys.stderr)
            return 1
        # fell behind the truncation while running: start_query starts it again from the
        # newest checkpoint (the next loop)
        print(f"kwal cn spark: the query fell behind the logtail truncation ("
              f"{_lost_where(lost, _topic_names(cfg.topics.catalog, topics))}); starting "
              "again from the newest checkpoint", file=sys.stderr, flush=True)
    for t in tables:
        print(f"{t}: watermark {watermark(output, t)}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point for `spark-submit consumers/spark/job.py ...` (and `python -m`)."""
    from infra.config import KwalConfig

    ap = argparse.ArgumentParser(description="kwal Spark CN job")
    add_job_arguments(ap)
    ap.add_argument("--bootstrap", default="", help="Kafka bootstrap servers (default: config)")
    ap.add_argument("--topic-prefix", default="", help="kwal topic prefix (default: config)")
    args = ap.parse_args(argv)
    cfg = KwalConfig.load()
    if args.bootstrap:
        cfg = cfg.with_bootstrap(args.bootstrap)
    if args.topic_prefix:
        cfg.topics.prefix = args.topic_prefix
    return run(args, cfg)


if __name__ == "__main__":
    raise SystemExit(main())
