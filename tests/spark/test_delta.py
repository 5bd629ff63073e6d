"""The Spark CN's Delta Lake output (consumers.spark.delta_sink / delta_reader) on a real
SparkSession with Delta's jars, read back by plain Spark, by kwal's `read_as_of` and by an
independent reader (delta-rs, the `deltalake` package), on a local path and over s3a:// on
the loopback S3 server."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import deltalake
import pytest

from consumers.spark.delta_reader import AboveWatermarkError, read_as_of, run_query
from consumers.spark.delta_sink import (
    BATCH_KEY,
    DROPPED_PROPERTY,
    WATERMARK_KEY,
    OutputOwnerError,
    _history_metadata,
    app_id,
    distinct_row_ids,
    incarnation_path,
    mark_dropped,
    merge_batch,
    table_path,
    watermarks,
)
from consumers.spark.job import check_output, start_query
from consumers.spark.job_state import read_job_state, write_job_state
from consumers.spark.progress import Progress, load_progress, write_progress
from consumers.spark.session import configure_s3a
from infra.config import KwalConfig, ObjectStoreConfig
from infra.objectstore import FolderStore, S3Store
from tests.logtail.conftest import COLUMNS, random_steps, start_tn
from tests.spark.helpers import tn_rows
from tests.waiting import wait_until

TIMEOUT_S = 600  # a bound on a hang: under load 30 on 2 cores two batches took over 240 s
CATCH_UP_S = 600  # the restarted job's bound (under load a Delta commit took seconds)

SCHEMA = "__op string, __row_id long, __commit_ts long, id long, v string"
# micro-batches of one table: (changes, watermark). Batch 1 updates id 1 at 12 (delete row 1,
# insert row 4), inserts row 5 at 12 and deletes it at 13 (inside the batch: the MERGE
# writes nothing of it, yet it is live at 12), deletes row 3 at 13; batch 2 adds a column.
# Batches 1 and 2 each repeat a row (the TN re-delivered its record): with deletes, without.
BATCHES: list[tuple[list[tuple[Any, ...]], int]] = [
    ([("I", 1, 10, 1, "a"), ("I", 2, 10, 2, "b"), ("I", 3, 11, 3, "c")], 11),
    ([("D", 1, 12, None, None), ("I", 4, 12, 1, "a2"), ("I", 5, 12, 5, "e"),
      ("D", 5, 13, None, None), ("D", 3, 13, None, None),
      ("I", 2, 10, 2, "b")], 13),  # row 2 re-delivered by the TN
    ([("I", 6, 14, 6, "f", 7), ("I", 6, 14, 6, "f", 7)], 15),
]


def _model(upto_ts: int) -> list[tuple[Any, ...]]:
    """The TN's rows at `upto_ts`: (row id, commit ts, id, v, extra)."""
    rows: dict[int, tuple[Any, ...]] = {}
    for changes, _ in BATCHES:
        for op, rid, ts, *cols in changes:
            if ts > upto_ts:
                continue
            if op == "I":
                rows[rid] = (rid, ts, *cols, *([None] * (3 - len(cols))))
            else:
                rows.pop(rid, None)
    return sorted(rows.values())


def _spark_rows(df: Any) -> list[tuple[Any, ...]]:
    cols = ["__row_id", "__commit_ts", "id", "v", "extra"]
    return sorted(tuple(r.asDict().get(c) for c in cols) for r in df.collect())


def _arrow_rows(table: Any) -> list[tuple[Any, ...]]:
    cols = ["__row_id", "__commit_ts", "id", "v", "extra"]
    return sorted(tuple(r.get(c) for c in cols) for r in table.to_pylist())


def _write_all(spark: Any, path: str, files: Path | None = None) -> None:
    """Each batch of BATCHES into the Delta table at `path`. With `files`, the batch's
    changes are read from Parquet files written there, as the job's change log is (the
    sink then checks the row ids on the driver and skips the shuffle for batch 0, which
    repeats none); without, from an in-memory DataFrame (always the shuffle)."""
    from pyspark.sql import functions as F

    for batch_id, (changes, watermark) in enumerate(BATCHES):
        df = spark.createDataFrame([c[:5] for c in changes], SCHEMA)
        if len(changes[0]) > 5:
            df = df.withColumn("extra", F.lit(changes[0][5]).cast("long"))
        if files is not None:
            df.write.parquet(str(files / f"batch={batch_id}"))
            df = spark.read.parquet(str(files / f"batch={batch_id}"))
        deletes = any(c[0] == "D" for c in changes)
        assert merge_batch(spark, path, df, "job-1", batch_id, watermark, has_deletes=deletes)


def test_delta_state_time_travel_and_replay(spark: Any, tmp_path: Any) -> None:
    """Each micro-batch is one Delta version stamped with its kwal watermark: plain Spark
    (versionAsOf), kwal's read_as_of and delta-rs all equal the TN's rows at that ts; a
    replayed batch id adds nothing; an added column evolves the schema; a drop ends the
    table with a property."""
    path = table_path(str(tmp_path), "db.t")
    _write_all(spark, path, tmp_path / "changes")
    # the sink's check for a repeated row id (its shuffle-free path): from the files only
    read = [spark.read.parquet(str(tmp_path / "changes" / f"batch={b}")) for b in range(3)]
    assert [distinct_row_ids(df) for df in read] == [True, False, False]
    assert not distinct_row_ids(spark.createDataFrame([("I", 1, 10, 1, "a")], SCHEMA))
    marks = watermarks(spark, path)
    assert [w for _, w in marks] == [w for _, w in BATCHES]

    # a batch replayed after a crash (same app id and batch id): no new version, no row twice
    changes, watermark = BATCHES[1]
    again = spark.createDataFrame(changes, SCHEMA)
    assert not merge_batch(spark, path, again, "job-1", 1, watermark)
    assert watermarks(spark, path) == marks
    # another job (its own app id, batch ids from 0) is refused, not skipped silently
    with pytest.raises(OutputOwnerError, match=f"{path}: written by another job"):
        merge_batch(spark, path, again, "job-2", 0, watermark)
    assert watermarks(spark, path) == marks

    for version, ts in marks:
        plain = spark.read.format("delta").option("versionAsOf", version).load(path)
        assert _spark_rows(plain) == _model(ts), f"version {version}"
        rs = deltalake.DeltaTable(path, version=version).to_pyarrow_table()
        assert _arrow_rows(rs) == _model(ts), f"delta-rs, version {version}"
    # at the watermarks, and inside versions (the change feed + the interval changes: row 5
    # live at 12 only, row 3 deleted at 13)
    for ts in (11, 12, 13, 14, 15):
        assert _spark_rows(read_as_of(spark, path, ts)) == _model(ts), f"ts {ts}"
    assert [r[0] for r in _model(12)] == [2, 3, 4, 5]
    with pytest.raises(AboveWatermarkError, match="past the watermark 15"):
        read_as_of(spark, path, 16)

    changes_feed = spark.sql(f"SELECT _change_type, __row_id FROM table_changes_by_path('{path}', 0)")
    assert sorted((r[0], r[1]) for r in changes_feed.collect()) == sorted(
        [("insert", 1), ("insert", 2), ("insert", 3), ("delete", 1), ("delete", 3), ("insert", 4),
         ("insert", 6)]
    )

    # a batch with no change for the table: a version that only moves the watermark
    assert merge_batch(spark, path, spark.createDataFrame([], SCHEMA), "job-1", 3, 16,
                       has_changes=False)
    assert [w for _, w in watermarks(spark, path)] == [w for _, w in BATCHES] + [16]
    assert _spark_rows(read_as_of(spark, path, 16)) == _model(16)

    assert mark_dropped(spark, path, 4, drop_ts=17)
    assert not mark_dropped(spark, path, 4, drop_ts=17)  # replayed: already ended
    props = deltalake.DeltaTable(path).metadata().configuration
    assert props[DROPPED_PROPERTY] == "17"


def test_delta_on_s3a(spark: Any, s3_config: ObjectStoreConfig, s3_store: S3Store) -> None:
    """The same output on `s3a://` against the loopback S3 server, credentials from kwal's
    config; delta-rs reads it from S3 too."""
    s3_store.ensure_bucket()
    configure_s3a(spark, s3_config)
    path = table_path(f"s3a://{s3_store.bucket}/{s3_store.prefix}out", "db.t")
    _write_all(spark, path)
    version, ts = watermarks(spark, path)[-1]
    assert _spark_rows(spark.read.format("delta").load(path)) == _model(ts)
    options = {
        "AWS_ENDPOINT_URL": s3_config.endpoint_url,
        "AWS_ACCESS_KEY_ID": s3_config.access_key_id,
        "AWS_SECRET_ACCESS_KEY": s3_config.secret_access_key,
        "AWS_REGION": s3_config.region,
        "AWS_ALLOW_HTTP": "true",
    }
    rs = deltalake.DeltaTable(path.replace("s3a://", "s3://"), storage_options=options)
    assert rs.version() == version
    assert _arrow_rows(rs.to_pyarrow_table()) == _model(ts)


# -- the job ---------------------------------------------------------------------------


def _job(
    cfg: KwalConfig, output: str | Path, log: Path, trigger: str, *extra: str
) -> subprocess.Popen[str]:
    """`spark-submit consumers/spark/job.py`'s entry point in a process of its own, its
    stderr (Spark's log, the job's per-batch timings) appended to `log`: a pipe nobody reads
    while the job runs fills up and stalls it."""
    env = {**os.environ, **cfg.to_env(), "KWAL_CONFIG": os.devnull, "KWAL_SPARK_TIMINGS": "1"}
    argv = [
        sys.executable, "-m", "consumers.spark.job", "--tables", ",".join(JOB_TABLES),
        "--output", str(output), "--trigger", trigger, "--from-checkpoint", "never", *extra,
    ]
    with open(log, "a") as err:
        # a process group of its own: the Spark driver JVM is the job's child, and a kill
        # of the job alone leaves it writing the job's checkpoint for a while
        return subprocess.Popen(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True, start_new_session=True
        )


def _kill_job(job: subprocess.Popen[str]) -> None:
    """SIGKILL the job's process group (its Spark JVM too) and wait until none of it runs."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, signal.SIGKILL)
    job.wait(30)

    def gone() -> bool:
        try:
            os.killpg(job.pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until("the job's process group ended", gone, 30)


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _committed_batch(output: Path) -> int:
    prog = load_progress(output)
    return -1 if prog is None else prog.batch_id


def _user_rows(rows: list[dict[str, Any]], columns: list[str]) -> list[dict[str, Any]]:
    """The Delta rows with the TN's columns; a column the catalog added after the version's
    watermark must be null there."""
    out = []
    for r in rows:
        extra = {k: v for k, v in r.items() if k not in columns and not k.startswith("__")}
        assert all(v is None for v in extra.values()), extra
        out.append({c: r.get(c) for c in columns})
    return sorted(out, key=lambda r: r["id"])


JOB_TABLES = ["db.a", "db.b"]


class Output:
    """Where the kill test's job writes: its Delta tables (`delta`, a local path or an
    s3a:// URL on the loopback S3 server) and its work directory (local), and how delta-rs
    opens a table there."""

    def __init__(self, delta: str, work: Path, rs_options: dict[str, str] | None = None) -> None:
        self.delta, self.work, self.rs_options = delta, work, rs_options

    def job_args(self) -> list[str]:
        return ["--work-dir", str(self.work)] if self.delta != str(self.work) else []

    def delta_rs(self, path: str, version: int) -> Any:
        if self.rs_options is None:
            return deltalake.DeltaTable(path, version=version)
        return deltalake.DeltaTable(
            path.replace("s3a://", "s3://", 1), version=version, storage_options=self.rs_options
        )


@pytest.fixture
def job_output(
    spark: Any, kwal_config: KwalConfig, s3_config: ObjectStoreConfig, s3_store: S3Store, tmp_path: Path
) -> Output:
    """The kill test's output: s3a:// on the loopback S3 server, with a local work
    directory. Every other Spark CN test writes to a local path; this one, the suite's
    longest, runs once (on a local path too it cost the suite past its time budget)."""
    store = s3_store
    store.ensure_bucket()
    kwal_config.objectstore = s3_config  # the job's s3a:// credentials
    configure_s3a(spark, s3_config)
    return Output(f"s3a://{store.bucket}/{store.prefix}out", tmp_path / "work", {
        "AWS_ENDPOINT_URL": s3_config.endpoint_url,
        "AWS_ACCESS_KEY_ID": s3_config.access_key_id,
        "AWS_SECRET_ACCESS_KEY": s3_config.secret_access_key,
        "AWS_REGION": s3_config.region,
        "AWS_ALLOW_HTTP": "true",
    })


def _inside(marks: list[tuple[int, int]], stamps: list[int]) -> list[int]:
    """A ts strictly inside the first, a middle and the newest interval between two
    versions' watermarks (a ts inside a version: `read_as_of` needs the change feed): the
    middle kwal commit ts in it, or its midpoint where no commit fell (which intervals get
    commits depends on how the job's batches fell; the newest always has the restart's)."""
    gaps = list(zip(marks, marks[1:], strict=False))
    out = set()
    for (_, lo), (_, hi) in {gaps[0], gaps[len(gaps) // 2], gaps[-1]}:
        inside = sorted(t for t in stamps if lo < t < hi)
        out.add(inside[len(inside) // 2] if inside else (lo + hi) // 2)
    return sorted(out)


def test_job_killed_mid_stream_and_restarted_writes_each_row_once(
    spark: Any, kwal_config: KwalConfig, job_output: Output, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The job process follows a TN under load (DML, drop and re-create of db.b, added
    columns) into Delta (s3a:// on the loopback S3 server with a local work directory), is
    killed with SIGKILL between or inside micro-batches, its work directory deleted, and
    restarted (it resumes from the output alone, batch ids continuing): every
    Delta version kwal stamped, read by delta-rs (the first, a middle and the newest also by
    plain Spark), equals the TN at the version's watermark (no row lost, none twice), no
    batch id commits twice to a table (the replayed batch wrote nothing), and `read_as_of`
    (also through `kwal cn query --spark-output`) equals the TN at commit ts strictly
    between two versions' watermarks."""
    cfg = kwal_config
    tn = start_tn(cfg, FolderStore(tmp_path / "objects"))
    output, work = job_output.delta, job_output.work
    rng = random.Random(29)
    stamps = [tn.create("a", "b")]
    job = None
    try:
        random_steps(tn, rng, 10, stamps)
        assert tn.logtail.publisher.flush(30), tn.logtail.publisher.errors
        log = tmp_path / "job.log"
        job = _job(cfg, output, log, "200 milliseconds", "--max-records-per-trigger", "40",
                   *job_output.job_args())
        deadline = time.monotonic() + TIMEOUT_S
        while _committed_batch(work) < 1:  # under way: more load while it runs
            assert job.poll() is None, _tail(log)
            assert time.monotonic() < deadline, f"the job committed no batch: {_tail(log)}"
            if len(stamps) < 40:
                random_steps(tn, rng, 2, stamps)
            else:  # enough load: poll the job's progress (the wait ends early if it dies)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    job.wait(0.2)
        _kill_job(job)
        killed_at = _committed_batch(work)
        # its work directory (progress, change log, Spark checkpoint) is lost: the restart
        # resumes from the output alone (`_kwal_job`, consumers.spark.job_state)
        shutil.rmtree(work)

        def recreate(t: Any) -> None:
            t.drop_table("db", "b")
            t.create_table("db", "b", COLUMNS, "id")

        stamps.append(tn.commit(recreate))  # the restarted job ends b's first incarnation
        random_steps(tn, rng, 10, stamps)
        final = tn.engine.heartbeat().result(10)
        assert tn.logtail.publisher.flush(30), tn.logtail.publisher.errors

        # available-now: it ends once it has read what the topics held at its start (the
        # timeout only bounds a hang; a job stopped by it fails the watermark check below)
        job = _job(cfg, output, log, "available-now", "--timeout", str(CATCH_UP_S),
                   *job_output.job_args())
        job.wait(timeout=CATCH_UP_S + 60)
        assert job.returncode == 0, _tail(log)
        assert "resumed from the output's resume point" in log.read_text(errors="replace")
        prog = load_progress(work)
        assert prog is not None and prog.batch_id > killed_at  # batch ids continue
        assert prog.watermark("db.a") >= final, f"the restarted job did not catch up: {_tail(log)}"

        checked = 0
        for name in JOB_TABLES:
            tp = prog.tables[name]
            for number, inc in enumerate(tp.incarnations):
                path = incarnation_path(output, name, number, inc.table_id)
                # one MERGE per batch id (mark_dropped's version repeats its batch's id)
                history = _history_metadata(spark, path)
                batches = [m[BATCH_KEY] for m in history if WATERMARK_KEY in m]
                assert len(batches) == len(set(batches)), (path, batches)
                assert any(DROPPED_PROPERTY in m or "kwal_dropped_ts" in m for m in history) == bool(
                    inc.drop_ts
                ), path
                marks = sorted((m["version"], int(m[WATERMARK_KEY])) for m in history if WATERMARK_KEY in m)
                # every version by delta-rs (an independent reader, fast); by plain Spark
                # the first, a middle and the newest of db.a, the newest of db.b's (a Spark
                # read of a version rebuilds its snapshot: seconds on a loaded machine)
                picks = [marks[0], marks[len(marks) // 2], marks[-1]] if name == "db.a" else marks[-1:]
                by_spark = {v for v, _ in picks}
                for version, ts in marks:
                    table = name.split(".")[1]
                    want = tn_rows(tn, table, ts)
                    rs = job_output.delta_rs(path, version).to_pyarrow_table()
                    rows = rs.to_pylist()
                    assert len({r["__row_id"] for r in rows}) == len(rows), (path, version)
                    cols = list(want[0]) if want else [c for c in rs.column_names if not c.startswith("__")]
                    assert _user_rows(rows, cols) == want, ("delta-rs", path, version, ts)
                    if version in by_spark:
                        df = spark.read.format("delta").option("versionAsOf", version).load(path)
                        assert _user_rows(df.toArrow().to_pylist(), cols) == want, (path, version, ts)
                    checked += 1
        assert len(prog.tables["db.b"].incarnations) >= 2  # the drop and re-create happened
        assert watermarks(spark, table_path(output, "db.a"))[-1][1] >= final
        assert checked >= 6

        # read_as_of at commit ts strictly inside versions (the version below, the change
        # feed of the next one and its interval changes), and `kwal cn query --spark-output`
        # at one of them (in this process: the shared session)
        path_a = table_path(output, "db.a")
        marks_a = watermarks(spark, path_a)
        inside = _inside(marks_a, stamps)
        assert inside[-1] in stamps and marks_a[-2][1] < inside[-1] < marks_a[-1][1], (marks_a, inside)
        for ts in inside:
            want = tn_rows(tn, "a", ts)
            got = read_as_of(spark, path_a, ts).toArrow().to_pylist()
            assert len({r["__row_id"] for r in got}) == len(got), ts
            assert _user_rows(got, list(want[0]) if want else []) == want, ("read_as_of", ts)
        capsys.readouterr()
        ts = inside[len(inside) // 2]
        args = argparse.Namespace(spark_output=output, table="db.a", ts=ts, json=True)
        assert run_query(args, cfg) == 0
        got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        want = tn_rows(tn, "a", ts)
        assert _user_rows(got, list(want[0]) if want else []) == want, ("kwal cn query", ts)
    finally:
        if job is not None and job.poll() is None:
            _kill_job(job)
        tn.close()


def test_an_output_in_the_old_layout_is_refused_by_name(tmp_path: Path) -> None:
    """An output an earlier kwal wrote (`<db>.<table>/state/batch=N`) is not continued: the
    error names the path and what to do; an s3a:// output needs a local work directory."""
    (tmp_path / "db.a" / "state" / "batch=3").mkdir(parents=True)
    with pytest.raises(ValueError, match=rf"{tmp_path}: written by an earlier kwal.*new --output"):
        check_output(str(tmp_path), str(tmp_path), ["db.a"])
    check_output(str(tmp_path), str(tmp_path), ["db.b"])  # another table: nothing in the old layout
    with pytest.raises(ValueError, match="s3a://b/p: an s3a:// output needs a local --work-dir"):
        check_output("s3a://b/p", "s3a://b/p", ["db.a"])


def test_a_job_that_would_restart_its_batch_ids_is_refused(spark: Any, tmp_path: Path) -> None:
    """The Delta tables skip a batch id at or below the last one committed: a job whose batch
    ids would restart at 0 is refused with an error naming why, before it reads a record
    (no broker at the address): a new work directory next to an existing output's tables,
    and progress whose Spark checkpoint is gone."""
    output, work = tmp_path / "out", tmp_path / "work"
    _write_all(spark, table_path(str(output), "db.a"))

    def start(work_dir: Path) -> None:
        start_query(spark, "127.0.0.1:9", "cat", {"db.a": "t.a", "db.b": "t.b"}, str(output),
                    work_dir=work_dir, from_checkpoint="never")

    with pytest.raises(ValueError, match=rf"{output}/db.a: a Delta table of another job"):
        start(work)
    write_progress(work, Progress(batch_id=4, catalog_topic="cat"))
    with pytest.raises(ValueError, match=r"committed up to micro-batch 4 but Spark's checkpoint"):
        start(work)
    # a resume point another job wrote (another txnAppId): not continued, named
    write_job_state(spark, str(output), "kwal-cn-other", Progress(batch_id=7, catalog_topic="cat"))
    with pytest.raises(OutputOwnerError, match=rf"{output}/_kwal_job: written by another job"):
        start(tmp_path / "work2")


def test_a_job_resumes_from_its_output_alone(spark: Any, tmp_path: Path) -> None:
    """The output's resume point (`_kwal_job`) at batch 7 and db.a's Delta table ahead of it
    (batch 2 committed at watermark 15 after the resume point's delta_ts 11: a crash
    between the tables' commits and the resume point's): a job with a new work directory
    resumes from the output alone -- the resume point's offsets and catalog, db.a's
    delta_ts raised to its table's watermark (the re-read changes at or below it are
    dropped), batch ids continuing at 9 above every id any table holds -- and writes its
    progress to the output first (resumed again, it continues at 10); a merge below the
    table's last watermark writes nothing."""
    from consumers.spark.job import resume_from_output
    from consumers.spark.progress import TableProgress

    output, work = str(tmp_path / "out"), tmp_path / "work"
    app = app_id(output)
    path = table_path(output, "db.a")
    for batch_id, (changes, watermark) in enumerate(BATCHES[:2]):
        assert merge_batch(spark, path, spark.createDataFrame(changes, SCHEMA), app, batch_id, watermark)
    state = Progress(batch_id=7, catalog_topic="cat", catalog_watermark=20, catalog_offset=5)
    state.tables["db.a"] = TableProgress(
        "db.a", "t.a", watermark=16, delta_ts=11, offsets=[[6, 40, 13], [7, 52, 16]], next_offset=60
    )
    state.tables["db.b"] = TableProgress("db.b", "t.b", next_offset=3)  # read, nothing in Delta
    write_job_state(spark, output, app, state)
    assert read_job_state(spark, output, app).start_offsets == {"cat": 5, "t.a": 40, "t.b": 3}  # type: ignore[union-attr]
    # written by the driver with delta-rs: Spark's Delta reads it; a replayed batch id (7)
    # writes nothing (the txn the table records)
    job_path = f"{output}/_kwal_job"
    assert [(r["batch"], r["app"]) for r in spark.read.format("delta").load(job_path).collect()] == [(7, app)]
    version = deltalake.DeltaTable(job_path).version()
    write_job_state(spark, output, app, Progress(batch_id=7, catalog_topic="other"))
    assert deltalake.DeltaTable(job_path).version() == version
    assert deltalake.DeltaTable(job_path).transaction_version(app) == 7

    write_progress(work, Progress(batch_id=3, catalog_topic="cat"))  # not this output's: dropped
    prog = resume_from_output(spark, output, work, work / "_checkpoint", ["db.a", "db.b"],
                              read_job_state(spark, output, app))
    assert prog is not None and (prog.batch_id, prog.batch_base) == (8, 9)
    assert prog.start_offsets == {"cat": 5, "t.a": 40, "t.b": 3}
    a = prog.tables["db.a"]
    assert (a.delta_ts, a.watermark, a.change_dirs, a.offsets) == (13, 13, [], [])
    assert load_progress(work) == prog
    again = read_job_state(spark, output, app)
    assert again is not None and again.batch_id == 8
    assert resume_from_output(spark, output, tmp_path / "w3", tmp_path / "c3", ["db.a"], again).batch_base == 10  # type: ignore[union-attr]

    # the table's last version claims 13: a version at or below it is not written
    marks = watermarks(spark, path)
    assert not merge_batch(spark, path, spark.createDataFrame([], SCHEMA), app, 9, 13, has_changes=False)
    assert watermarks(spark, path) == marks


def test_an_incarnation_gets_no_version_before_its_topic_reaches_it(
    spark: Any, tmp_path: Path
) -> None:
    """db.b created at 10, dropped and created again at 20, that one dropped and created again
    at 30 (the catalog topic is there), while b's own topic is only at 15: the first
    incarnation gets a version at 15, the second none yet (at 15 the TN has the first one's
    rows: a version of the second claiming 15 was the kill test's failure), and once the
    topic is past both drops each ends at the ts before its drop and the third starts."""
    from consumers.spark.batch_writer import BatchWriter
    from consumers.spark.progress import Incarnation, TableProgress
    from schemas.wal import ColumnDef, ColumnType, TableSchema

    schema = TableSchema((ColumnDef(1, "id", ColumnType.INT64), ColumnDef(2, "v", ColumnType.STRING)), "id")
    out = str(tmp_path / "out")
    writer = BatchWriter(tmp_path / "work", "cat", {"db.b": "t.b"}, delta_output=out)
    tp = TableProgress("db.b", "t.b", watermark=15, incarnations=[
        Incarnation(10, 1, 20, [(10, schema)]),
        Incarnation(20, 2, 30, [(20, schema)]),
        Incarnation(30, 3, 0, [(30, schema)]),
    ])
    paths = [incarnation_path(out, "db.b", n, i.table_id) for n, i in enumerate(tp.incarnations)]
    writer._to_delta(spark, 0, tp, 15, drained=False)
    assert [w for _, w in watermarks(spark, paths[0])] == [15]
    assert not Path(paths[1]).exists() and not Path(paths[2]).exists()

    tp.watermark = 35
    writer._to_delta(spark, 1, tp, 35, drained=False)
    assert [w for _, w in watermarks(spark, paths[0])] == [15, 19]
    assert [w for _, w in watermarks(spark, paths[1])] == [29]
    assert [w for _, w in watermarks(spark, paths[2])] == [35]
    for path, dropped in zip(paths, ("20", "30", None), strict=True):
        assert deltalake.DeltaTable(path).metadata().configuration.get(DROPPED_PROPERTY) == dropped
