"""The Spark Structured Streaming CN job: logtail topics -> readable, versioned Parquet state.

    kwal cn spark --tables db.t1,db.t2 --output PATH [--trigger 1s|available-now]
    spark-submit consumers/spark/job.py --tables db.t1 --output PATH --bootstrap host:port

One streaming query reads the catalog topic and the tables' logtail topics through
`consumers.spark.source.kafka_stream` (startingOffsets earliest; Spark's built-in `kafka`
source by default, `--source kwal` for kwal's own: docs/perf-spark.md); each micro-batch is
written by `consumers.spark.batch_writer.BatchWriter` (its docstring numbers the steps and
says why a batch commits exactly once); `consumers.spark.reader` reads the output back
(state, changes, as of a commit ts).

Layout. `output` (a local path or s3a://) holds one Delta table per kwal table and
incarnation (`consumers.spark.delta_sink`; docs/delta.md): `<db>.<table>`, and
`<db>.<table>@<table id>` for a table created again. The work directory (`work_dir`,
default `output`; local) holds what only the job reads:

    _progress/<batch id>.json                   where the next batch resumes: batch id,
                                                catalog, watermarks, table numbers
    _changes/batch=<id>/__table=<n>/            the decoded change log (Parquet) of table
                                                number n; user columns named t<n>__<column>
    _changes/batch=<id>/__table=-1/             the batch's catalog records (bytes)
    _changes/redecoded/<db>.<table>/batch=<id>/ late-decoded records (see batch_writer)
    <db>.<table>/bootstrap/                     a job started from a checkpoint: the table's
                                                rows at its ts (batch -1)
    _progress/bootstrap.json                    that start's commit (horizon, start offsets)
    _checkpoint/                                Spark's checkpointLocation (default)

An output an earlier kwal wrote in its own layout (`<db>.<table>/state/batch=N`) is
refused (`check_output`).

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
Python worker; the Delta tables on s3a:// or a shared filesystem, and a `--work-dir` every
node and the driver share (the driver writes progress files and reads each batch's
change-log files with plain file I/O: a local path, NFS or a FUSE mount).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from consumers.core.exceptions import (
    BootstrapError,
    TruncatedLogtailError,
)
from consumers.spark.arguments import FROM_CHECKPOINT, add_job_arguments
from consumers.spark.batch_writer import BatchWriter
from consumers.spark.bootstrap import bootstrap_output
from consumers.spark.decode import (
    TABLE,
)
from consumers.spark.delta_sink import app_id
from consumers.spark.jars import delta_jars
from consumers.spark.job_state import (
    JOB_STATE,
    delete_job_state,
    read_job_state,
    restore_progress,
    write_job_state,
)
from consumers.spark.progress import (
    Progress,
    TableProgress,
    apply_catalog,
    load_progress,
    query_name,
    write_progress,
)
from consumers.spark.reader import watermark
from consumers.spark.resume import discard_output, discard_work, lost_positions, resume_positions
from consumers.spark.session import DELTA_CONF, DELTA_JOB_CONF, build_session, s3a_conf
from infra.objectstore import ObjectStore
from schemas.logtail import decode_logtail
from schemas.wal import TableSchema

log = logging.getLogger(__name__)
T = TypeVar("T")

# `kwal cn spark` starts a query that fell behind the truncation again at most this many
# times in a row without a batch committed in between (the truncation outruns it).
MAX_RESTARTS = 3




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
    work_dir: str | Path | None = None,
    source: str | None = None,
) -> Any:
    """Start the CN query (returns the StreamingQuery). `trigger`: "available-now", or a
    processing-time interval ("1s", "500 milliseconds"). `source`: the Kafka source, "kwal"
    or "builtin" (`consumers.spark.source.choose_source`; None: the default, or
    `KWAL_SPARK_BUILTIN_KAFKA`).

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
    from consumers.spark.source import choose_source, kafka_stream

    use_builtin = choose_source(spark, source) == "builtin"
    delta_output = str(output)
    work = str(work_dir or delta_output)
    for key, value in DELTA_JOB_CONF.items():  # SQL confs: a running session takes them
        spark.conf.set(key, value)
    check_output(delta_output, work, list(table_topics))
    output = Path(work)
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
    state = read_job_state(spark, delta_output, app_id(delta_output))
    prog = resume_from_output(spark, delta_output, output, ckpt, list(table_topics), state)
    check_continuation(spark, delta_output, output, ckpt, list(table_topics), prog)
    # the catalog's schemas (decoding hints, needed by the plan below) read from Kafka while
    # the driver checks the topics' offsets and writes the first resume point
    hints_soon = in_background(catalog_hints, bootstrap, catalog_topic, list(table_topics), dict(options))
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
            state = None
            discard_job(spark, delta_output, output, ckpt, sorted(set(prog.tables) | set(table_topics)))
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
    hints = hints_soon()
    writer = BatchWriter(
        output, catalog_topic, table_topics, compact_interval_s, hints, store=store,
        delta_output=delta_output,
    )
    if state is None:  # a new job: its first resume point, before any table is written
        write_job_state(spark, delta_output, writer.app_id, writer._fresh_progress())
    plan = writer.source_plan()
    df = kafka_stream(
        spark, bootstrap, topics, use_builtin=use_builtin, decode=plan.to_json(), **options
    )
    writer.decoded = plan if TABLE in df.columns else None  # the built-in source does not decode
    w = df.writeStream.foreachBatch(writer).option("checkpointLocation", str(ckpt)).queryName(
        query_name(output)
    )
    if trigger in ("available-now", "availableNow", "once"):
        w = w.trigger(availableNow=True)
    else:
        w = w.trigger(processingTime=_interval(trigger))
    return w.start()


def in_background(fn: Callable[..., T], *args: Any) -> Callable[[], T]:
    """Run `fn(*args)` in a daemon thread now; the returned callable waits for it and returns
    its result, or raises what it raised (a query's start that fails before it waits
    leaves the thread to end on its own: its reads are bounded by their poll timeout)."""
    result: Future[T] = Future()

    def run() -> None:
        try:
            result.set_result(fn(*args))
        except BaseException as e:  # re-raised by the waiter
            result.set_exception(e)

    name = f"kwal-{getattr(fn, '__name__', 'task')}"
    threading.Thread(target=run, name=name, daemon=True).start()
    return result.result


def check_output(delta_output: str, work: str, tables: Sequence[str]) -> None:
    """Refuse what the job cannot write to: an s3a:// output without a local work directory
    (the change log and progress files are plain file I/O), and an output the job wrote in
    its old layout (`<db>.<table>/state/batch=N`, read by kwal only): its tables are not
    Delta tables and cannot be continued."""
    if work.startswith("s3a://"):
        raise ValueError(
            f"--output {delta_output}: an s3a:// output needs a local --work-dir for the job's "
            "change log, progress and Spark checkpoint"
        )
    if delta_output.startswith("s3a://"):
        return
    old = [t for t in tables if (Path(delta_output) / t / "state").is_dir()]
    if old:
        raise ValueError(
            f"{delta_output}: written by an earlier kwal in its own layout ({old[0]}/state/; "
            "tables are Delta tables now): point the job at a new --output, or delete this one "
            "to rebuild it from the topics"
        )


def resume_from_output(
    spark: Any, delta_output: str, work: Path, ckpt: Path, tables: Sequence[str],
    state: Progress | None,
) -> Progress | None:
    """The progress the job continues from: the work directory's, unless the output's
    resume point (`consumers.spark.job_state`, `state`) is at another batch -- the work
    directory is new, lost, or not this output's -- then the tables win: the work
    directory's state is dropped and the job resumes from the output alone (its progress
    is written to both)."""
    prog = load_progress(work)
    if state is None or (prog is not None and prog.batch_id == state.batch_id):
        return prog
    discard_work(work, ckpt, sorted(set(state.tables) | set(tables)))
    prog = restore_progress(spark, delta_output, state)
    write_job_state(spark, delta_output, app_id(delta_output), prog)
    write_progress(work, prog)
    log.warning("Spark CN %s: resuming from the resume point of %s (batch %d)", work,
                delta_output, state.batch_id)
    return prog


def check_continuation(
    spark: Any, delta_output: str, work: Path, ckpt: Path, tables: Sequence[str],
    prog: Progress | None,
) -> None:
    """Refuse a start that would skip micro-batches silently. The Delta tables hold each
    batch id the job committed (txnVersion) and the job skips a batch id at or below it,
    so the batch ids must continue where the tables' left off:

    - no progress in the work directory (a new job, or a new --work-dir) but Delta tables
      of these tables under the output: the new job's batch ids restart at 0 and its
      history would be replayed over the tables' newer state;
    - progress at batch N but no offsets in Spark's checkpointLocation (deleted, or a new
      --checkpoint): the query restarts at batch 0 and batches 0..N would be skipped
      (a progress resumed from the output, `resume_from_output`, starts a new checkpoint:
      its batch ids continue from `batch_base`)."""
    from consumers.spark.delta_reader import incarnation_paths

    if prog is None:
        found = _existing_delta(spark, delta_output, tables, incarnation_paths)
        if found:
            raise ValueError(
                f"{found[0]}: a Delta table of another job (this job's work directory {work} "
                f"has no progress and the output no resume point {JOB_STATE}/): point the job "
                "at a new --output, or at that job's --work-dir to continue it"
            )
    elif prog.batch_id >= max(prog.batch_base, 0) and not any(p.name.isdigit() for p in _entries(ckpt / "offsets")):
        raise ValueError(
            f"{work}: the job committed up to micro-batch {prog.batch_id} but Spark's "
            f"checkpoint {ckpt} has no offsets: give it its --checkpoint, or start a new "
            "--output and --work-dir"
        )


def discard_job(spark: Any, delta_output: str, work: Path, ckpt: Path, tables: list[str]) -> None:
    """Forget everything a job wrote, before it starts again from a checkpoint:
    1. its resume point `_kwal_job` (first: a crash after it resumes nothing);
    2. the work directory's state and Spark's checkpoint (`discard_output`), with the
       Delta tables when they are under the work directory;
    3. the Delta tables under an output that is not the work directory (s3a://, or a
       local `--output` beside a `--work-dir`): a table left there would keep rows the
       checkpoint no longer has."""
    delete_job_state(spark, delta_output)  # 1.
    discard_output(work, ckpt, tables)  # 2.
    if delta_output.startswith("s3a://") or Path(delta_output).resolve() != work.resolve():
        _delete_delta(spark, delta_output, tables)  # 3.


def _delete_delta(spark: Any, delta_output: str, tables: Sequence[str]) -> None:
    """Remove the Delta tables of `tables` (every incarnation) under `delta_output`,
    through Hadoop's filesystem (local paths and s3a:// alike)."""
    from consumers.spark.delta_reader import incarnation_paths

    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    for path in _existing_delta(spark, delta_output, tables, incarnation_paths):
        p = jvm.org.apache.hadoop.fs.Path(path)
        p.getFileSystem(conf).delete(p, True)


def _entries(d: Path) -> list[Path]:
    return list(d.iterdir()) if d.is_dir() else []


def _existing_delta(
    spark: Any, delta_output: str, tables: Sequence[str], paths: Any
) -> list[str]:
    from consumers.core.exceptions import TableNotFoundError

    found: list[str] = []
    for t in tables:
        try:
            found.extend(paths(spark, delta_output, t))
        except TableNotFoundError:
            return []  # no output there yet
    return found


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
    cfg's), args.source (kwal | builtin, see `start_query`). Exit code 0, 1 when the query failed or cannot start (a truncated topic, an
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
    delta_output = str(args.output)
    output = str(getattr(args, "work_dir", None) or delta_output)
    trigger = str(getattr(args, "trigger", "1s") or "1s")
    try:
        check_output(delta_output, output, tables)
    except ValueError as e:
        print(f"kwal cn spark: {e}", file=sys.stderr)
        return 2
    conf = {**DELTA_CONF, **DELTA_JOB_CONF}
    if delta_output.startswith("s3a://"):
        conf.update(s3a_conf(cfg.objectstore))
    spark = build_session(master=getattr(args, "master", None), jars=delta_jars(), conf=conf)
    topics = {t: cfg.topics.logtail(*t.split(".", 1)) for t in tables}
    kafka_opts = {f"kafka.{k}": v for k, v in cfg.kafka.items() if k != "bootstrap.servers"}
    store = open_store(cfg.objectstore)  # checkpoints, and large transactions' blocks
    from consumers.spark.status import attach_status

    # its watermark lag for `kwal ops status` (the ops topic), after every micro-batch
    attach_status(spark, cfg, output, Path(output).resolve().name)
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
                delta_output,  # the Delta tables; the work dir is `output`
                checkpoint=checkpoint,
                trigger=trigger,
                max_records_per_trigger=getattr(args, "max_records_per_trigger", None),
                source_options=kafka_opts,
                compact_interval_s=float(getattr(args, "compact_interval", None) or 10.0),
                store=store,
                from_checkpoint=from_checkpoint,
                work_dir=output,
                source=getattr(args, "source", None),
            )
        except (TruncatedLogtailError, BootstrapError) as e:
            print(f"kwal cn spark: cannot start: {e}", file=sys.stderr)
            return 1
        except ValueError as e:  # an output or checkpoint it cannot continue
            print(f"kwal cn spark: cannot start: {e}", file=sys.stderr)
            return 2
        prog = load_progress(output)
        if prog is not None and prog.horizon and prog.batch_id < 0:
            print(f"kwal cn spark: started from the checkpoint at ts {prog.horizon}",
                  file=sys.stderr, flush=True)
        if prog is not None and prog.batch_base > 0 and prog.batch_id == prog.batch_base - 1:
            print(f"kwal cn spark: resumed from the output's resume point ({JOB_STATE}/, batch "
                  f"{prog.batch_id - 1}); batch ids continue at {prog.batch_base}",
                  file=sys.stderr, flush=True)
        print(f"kwal cn spark: following {', '.join(tables)} into {delta_output} (trigger {trigger})",
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
        if from_checkpoint == "never" or not lost or restarts > MAX_RESTARTS:
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
