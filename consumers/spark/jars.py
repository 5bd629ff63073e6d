"""Spark connector jars pyspark's wheel lacks, from Maven Central (`jars/pom.xml`, resolved
once into the cache by infra.maven): today spark-avro, for `from_avro` on the change stream
(docs/change-stream.md). A local session takes them as `spark.jars` (`build_session`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from infra.maven import resolve_jars

POM = Path(__file__).with_name("jars") / "pom.xml"
SPARK_AVRO_VERSION = "4.2.0"  # the pom's; the cache directory is named by it


def spark_avro_jars() -> list[str]:
    """Paths of the spark-avro jar(s), resolved on first use (infra.maven.MavenError if
    Maven cannot)."""
    directory = resolve_jars(POM, f"spark-jars-avro-{SPARK_AVRO_VERSION}")
    return sorted(str(p) for p in directory.glob("*.jar"))


DELTA_POM = Path(__file__).with_name("jars") / "delta" / "pom.xml"


def delta_jars() -> list[str]:
    """Paths of Delta Lake's jars, hadoop-aws with the AWS SDK v2 modules S3A needs, and
    Spark's Kafka source (`jars/delta/pom.xml`), resolved on first use (about 30 MB). The
    cache directory is named by the pom's hash: an edited pom resolves again."""
    digest = hashlib.sha256(DELTA_POM.read_bytes()).hexdigest()[:12]
    directory = resolve_jars(DELTA_POM, f"spark-jars-delta-{digest}")
    return sorted(str(p) for p in directory.glob("*.jar"))
