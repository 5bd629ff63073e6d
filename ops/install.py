"""`kwal install`: resolve the JVM components kwal runs from Maven Central into the cache
now, instead of on first use.

Components (each goes through `infra.maven`'s cache steps: once, atomically, then reused):
- `kafka`: Apache Kafka's jars (the default broker: `kwal up`, the demo, the tests);
- `spark`: the connector jars PySpark's wheel lacks (spark-avro) and Delta Lake's (the
  Spark CN);
- `registry`: Apicurio Registry, built with Quarkus's Maven plugin (the change stream's
  schema registry; about a minute on a fresh machine).

Why ahead of time: on a fresh machine each one is otherwise resolved by the first broker,
Spark session or registry that needs it, inside whatever waits on it (a test, the demo).
It also prepares a machine that will later run without Maven Central. scripts/setup runs
this beside `pip install`, before the virtual environment has its packages: this module
and what it imports use the standard library only (tests/ops/test_install.py holds them
to it). One component after the other: concurrent `mvn` processes would share one local
Maven repository.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from consumers.spark.jars import delta_jars, spark_avro_jars
from infra.brokers.apache_kafka import kafka_classpath
from infra.registry.apicurio import registry_app


def _spark() -> None:
    spark_avro_jars()
    delta_jars()


COMPONENTS: dict[str, Callable[[], object]] = {
    "kafka": kafka_classpath,
    "spark": _spark,
    "registry": registry_app,
}


def install(names: Sequence[str]) -> list[str]:
    """Resolve the components named, in order; the errors, one line each (empty: all done).
    A component that fails does not stop the next one."""
    unknown = [n for n in names if n not in COMPONENTS]
    if unknown:
        raise ValueError(f"unknown component(s) {', '.join(unknown)}; known: {', '.join(COMPONENTS)}")
    errors = []
    for name in names:
        start = time.monotonic()
        try:
            COMPONENTS[name]()
        except (RuntimeError, OSError) as e:  # MavenError and the start errors are RuntimeErrors
            errors.append(f"{name}: {e}")
            continue
        print(f"kwal install: {name} ready ({time.monotonic() - start:.1f} s)", flush=True)
    return errors


def run(args: Any, cfg: Any = None) -> int:
    """`kwal install [COMPONENT ...]` (all of them by default)."""
    try:
        errors = install(args.components or list(COMPONENTS))
    except ValueError as e:
        print(f"kwal install: {e}", file=sys.stderr)
        return 2
    for line in errors:
        print(f"kwal install: {line}", file=sys.stderr)
    return 1 if errors else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("components", nargs="*", metavar="COMPONENT",
                        help=f"what to resolve: {', '.join(COMPONENTS)} (default: all)")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m ops.install`: the same command without the `kwal` entry point (which needs
    the virtual environment's packages)."""
    parser = argparse.ArgumentParser(prog="python -m ops.install", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
