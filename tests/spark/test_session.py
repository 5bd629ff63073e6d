"""The local session's SPARK_HOME mirror: Python workers import PySpark with bytecode."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from consumers.spark.session import bytecode_spark_home

pyspark = pytest.importorskip("pyspark", reason="PySpark is not installed")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)


def _package() -> Path:
    return Path(pyspark.__file__).resolve().parent


def test_the_mirror_links_every_entry_but_python(tmp_path: Path, clean_env: None) -> None:
    home = bytecode_spark_home(tmp_path)
    assert home is not None and home.parent == tmp_path
    package = _package()
    names = {p.name for p in home.iterdir()}
    assert names == {p.name for p in package.iterdir()} - {"python"}
    assert "jars" in names and "bin" in names
    assert all(os.readlink(home / n) == str(package / n) for n in names)
    assert not (home / "python" / "lib" / "pyspark.zip").exists()
    # built once: a second call returns the same directory, untouched
    stamp = (home / "jars").lstat().st_mtime_ns
    assert bytecode_spark_home(tmp_path) == home
    assert (home / "jars").lstat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [home.name]  # no staging left behind


def test_a_stale_mirror_is_rebuilt(tmp_path: Path, clean_env: None) -> None:
    home = bytecode_spark_home(tmp_path)
    assert home is not None
    (home / "jars").unlink()
    (home / "leftover").symlink_to(tmp_path)
    assert bytecode_spark_home(tmp_path) == home
    assert not (home / "leftover").exists()
    assert os.readlink(home / "jars") == str(_package() / "jars")


def test_the_users_choices_are_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "mine"))
    assert bytecode_spark_home(tmp_path) is None
    monkeypatch.delenv("SPARK_HOME")
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3-other")
    assert bytecode_spark_home(tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_cache_falls_back_to_the_temp_dir_then_to_spark_as_it_is(
    tmp_path: Path, clean_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert bytecode_spark_home(blocker / "cache") is None
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    home = bytecode_spark_home()
    assert home is not None and home.parent == tmp_path / "tmp" / f"kwal-{os.getuid()}"
    monkeypatch.setattr(tempfile, "tempdir", str(blocker / "tmp"))
    assert bytecode_spark_home() is None
    shared = tmp_path / "shared"  # others could swap the jars the JVM loads: refused
    shared.mkdir()
    shared.chmod(0o777)
    assert bytecode_spark_home(shared) is None and list(shared.iterdir()) == []


def _pyspark_file(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa
    import pyspark as worker_pyspark

    for _ in batches:
        yield pa.RecordBatch.from_pydict({"path": [worker_pyspark.__file__]})


def test_the_shared_sessions_workers_import_pyspark_from_site_packages(spark: Any) -> None:
    home = os.environ.get("SPARK_HOME", "")
    assert home, "build_session launched the JVM without a SPARK_HOME mirror"
    if not Path(home).name.startswith("spark-home-"):
        pytest.skip(f"SPARK_HOME={home!r} was set outside kwal, which leaves it alone")
    path = spark.range(1).mapInArrow(_pyspark_file, "path string").collect()[0]["path"]
    assert ".zip" not in path, path
    assert Path(path).resolve().parent == _package()


def test_the_shared_sessions_driver_jvm_runs_the_suites_jvm_flags(spark: Any) -> None:
    """tests/conftest.py's SPARK_SUBMIT_OPTS reach the driver JVM (C1 only, the serial
    collector, interpreted expressions: the suite's CPU, docs/measurements.md "Suite CPU"),
    its `-Dspark.*` property as a session setting."""
    wanted = os.environ.get("SPARK_SUBMIT_OPTS", "").split()
    assert wanted, "tests/conftest.py sets SPARK_SUBMIT_OPTS"
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(runtime.getInputArguments())
    assert all(flag in arguments for flag in wanted), (wanted, arguments)
    assert spark.conf.get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"
