"""The SparkSession the CN job, the demo, the bench and the tests run on.

`build_session` reuses an active session; under spark-submit (the JVM is already up) the
cluster's master and settings win; otherwise it starts a local one with the laptop settings
(`consumers.spark.job`'s docstring, "Memory").

Why a local session gets its own SPARK_HOME (`bytecode_spark_home`). Spark puts
`$SPARK_HOME/python/lib/pyspark.zip` first on the PYTHONPATH of every Python process it
starts (`PythonUtils.sparkPythonPath`). Python cannot cache bytecode for modules it imports
from a zip, so each such process compiles PySpark's modules again: importing the streaming
source runner took 1.2-2.1 s from the zip and 0.3-0.6 s from site-packages on a 2-core
machine. Every streaming query starts one of those processes for its source before its
first batch (measured: the first batch began 2.5-2.7 s after `start_query` with the zip,
1.2-1.5 s without). With a pip-installed PySpark, the same modules, of the same version,
are in the site-packages of the interpreter the workers run (`PYSPARK_PYTHON`, set to this
one), with bytecode. So, for a local session of a pip-installed PySpark only, the JVM is
launched with a SPARK_HOME that mirrors the package directory entry by entry (symlinks)
except `python/`: the workers then import PySpark from site-packages. A SPARK_HOME set by
the user, a PYSPARK_PYTHON that is another interpreter, and spark-submit are left alone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from infra.config import ObjectStoreConfig

log = logging.getLogger(__name__)


DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


# The job's Delta settings (consumers.spark.job.run). Its tables are small and written once
# per micro-batch, so per-write overheads dominate (a local session's snapshot partitions
# are set for every local session, `build_session`):
# - stats.collect: per-file column statistics are for data skipping on large scans; the job
#   never scans by predicate, readers still get correct results without them;
# - merge.materializeSource: MERGE caches its source unless told it is deterministic; the
#   job's source is the change log's Parquet files, which a batch never rewrites;
# - writeChecksumFile: after each commit Delta writes `<version>.crc` (table size, file
#   count, protocol and metadata), an optional file of the protocol that a reader uses when
#   present and replays the log without; writing it cost the job more than the commit it
#   follows: a one-row overwrite of `_kwal_job` took 2.1 s with it and 1.2 s without
#   (medians of 36, load 15-20; docs/perf-spark.md).
DELTA_JOB_CONF = {
    "spark.databricks.delta.stats.collect": "false",
    "spark.databricks.delta.merge.materializeSource": "none",
    "spark.databricks.delta.writeChecksumFile.enabled": "false",
}


def s3a_conf(store: ObjectStoreConfig) -> dict[str, str]:
    """Hadoop S3A settings for `s3a://` paths from kwal's object store config (endpoint,
    region, credentials), as `spark.hadoop.*` session settings."""
    conf = {
        "fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "fs.s3a.endpoint.region": store.region,
    }
    if store.endpoint_url:
        conf["fs.s3a.endpoint"] = store.endpoint_url
        conf["fs.s3a.path.style.access"] = "true"
        conf["fs.s3a.connection.ssl.enabled"] = str(store.endpoint_url.startswith("https")).lower()
    if store.access_key_id:
        conf["fs.s3a.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        )
        conf["fs.s3a.access.key"] = store.access_key_id
        conf["fs.s3a.secret.key"] = store.secret_access_key
    return {f"spark.hadoop.{k}": v for k, v in conf.items()}


def configure_s3a(spark: Any, store: ObjectStoreConfig) -> None:
    """Apply `s3a_conf` to a running session (its Hadoop configuration; new filesystems
    take it)."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3a_conf(store).items():
        hadoop.set(key.removeprefix("spark.hadoop."), value)


def build_session(
    app: str = "kwal-cn", master: str | None = None, driver_memory: str = "1g",
    jars: Sequence[str] = (), conf: Mapping[str, str] | None = None,
) -> Any:
    """A SparkSession for the job. Reuses an active one; under spark-submit (the JVM is already
    up: PYSPARK_GATEWAY_PORT is set) its master and settings win; otherwise a local session
    with the laptop settings, and `jars` on its classpath (`spark.jars`; e.g.
    `consumers.spark.jars.spark_avro_jars()`) and `conf` (e.g. `DELTA_CONF`, `s3a_conf`)
    set before the JVM starts."""
    worker_python_env()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.appName(app)
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        home = bytecode_spark_home()
        if home is not None:
            os.environ["SPARK_HOME"] = str(home)
        builder = (
            builder.master(master or "local[2]")
            .config("spark.driver.memory", driver_memory)
            .config("spark.sql.shuffle.partitions", "2")
            # the partitions Delta replays a table's log into (default 50: 50 tasks per
            # snapshot on 2 cores). A tiny Delta write and read in a warm session cost 10.0
            # CPU-s with 50 and 1.5 with 2 (docs/measurements.md, "Suite CPU").
            # Without Delta on the classpath the setting is never read
            .config("spark.databricks.delta.snapshotPartitions", "2")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
        )
        if jars:
            builder = builder.config("spark.jars", ",".join(jars))
        for key, value in (conf or {}).items():
            builder = builder.config(key, value)
    elif master:
        builder = builder.master(master)
    return builder.getOrCreate()


def worker_python_env() -> None:
    """Make Spark's Python workers run this interpreter, the one with pyarrow, confluent-kafka
    and kwal (call before the session starts; a value already set wins)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def bytecode_spark_home(cache_root: Path | None = None) -> Path | None:
    """The SPARK_HOME to launch a local JVM with so that Spark's Python workers import PySpark
    with bytecode (see the module docstring), or None to leave SPARK_HOME as it is.

    None when SPARK_HOME is already set, when the workers run another interpreter than this
    one, when PySpark is not a pip install (no `jars/` beside its `__init__.py`), or when no
    mirror can be written (logged; Spark then starts as usual, only slower).

    The mirror lives under `cache_root`, by default the first of `$XDG_CACHE_HOME/kwal` (or
    `~/.cache/kwal`) and `<temp dir>/kwal-<uid>` that can hold it, named by the package
    directory's path and PySpark's version. It is built once: in a temporary directory, then
    renamed into place, so concurrent sessions never see half of it. It must outlive the
    JVM (its class loader opens jars lazily), hence a cache and not a temporary directory
    removed at exit."""
    if os.environ.get("SPARK_HOME"):
        return None
    if os.environ.get("PYSPARK_PYTHON", sys.executable) != sys.executable:
        return None
    import pyspark

    package = Path(pyspark.__file__).resolve().parent
    if not (package / "jars").is_dir():
        return None
    key = hashlib.sha256(f"{package}|{pyspark.__version__}".encode()).hexdigest()[:16]
    name = f"spark-home-{pyspark.__version__}-{key}"
    errors = []
    for root in [cache_root] if cache_root is not None else _cache_dirs():
        home = root / name
        try:
            if not _mirrors(home, package):
                _build_mirror(home, package)
            return home
        except OSError as e:
            errors.append(f"{root}: {e}")
    log.info("kwal: no SPARK_HOME mirror (%s); Python workers import pyspark.zip", "; ".join(errors))
    return None


def _cache_dirs() -> list[Path]:
    """Where the mirror may live, in order of preference."""
    dirs = []
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except RuntimeError:  # no HOME and no passwd entry
            base = ""
    if base:
        dirs.append(Path(base) / "kwal")
    dirs.append(Path(tempfile.gettempdir()) / f"kwal-{os.getuid()}")
    return dirs


def _entries(package: Path) -> list[Path]:
    """Every entry of the package directory but `python/` (the one holding pyspark.zip)."""
    return sorted(p for p in package.iterdir() if p.name != "python")


def _mirrors(home: Path, package: Path) -> bool:
    """True when `home` holds exactly one symlink to each entry of `package` but `python/`."""
    if not home.is_dir():
        return False
    wanted = {p.name: p for p in _entries(package)}
    present = {p.name: p for p in home.iterdir()}
    if wanted.keys() != present.keys():
        return False
    return all(p.is_symlink() and Path(os.readlink(p)) == wanted[n] for n, p in present.items())


def _build_mirror(home: Path, package: Path) -> None:
    """0. refuse a parent directory another user could write to (in the temp dir fallback);
    1. link every entry in a fresh temporary directory beside `home`; 2. rename it to `home`
    (atomic); 3. if another process won the race with a complete mirror, keep theirs; a stale
    mirror (PySpark reinstalled with other entries) is replaced."""
    home.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = home.parent.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        # the mirror decides which jars the JVM loads: never in a directory others can write
        raise PermissionError(f"{home.parent} is not private to this user")
    staging = Path(tempfile.mkdtemp(prefix=f".{home.name}-", dir=home.parent))
    try:
        for entry in _entries(package):
            (staging / entry.name).symlink_to(entry)
        try:
            staging.rename(home)
            return
        except OSError:
            if _mirrors(home, package):
                return
        shutil.rmtree(home, ignore_errors=True)
        staging.rename(home)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
