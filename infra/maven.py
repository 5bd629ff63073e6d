"""JVM components from Maven Central, resolved by `mvn` into a cache outside the repo.

A component is a `pom.xml` in this repository that only names jars (nothing is
built). `resolve_jars` copies its runtime dependencies into
`<cache>/<name>/` once:

1. look for `<cache>/<name>/.complete` (written last): present means done;
2. run `mvn -B -q dependency:copy-dependencies -DincludeScope=runtime` with the
   output in a fresh temporary directory beside the final one;
3. write `.complete` into it and rename it into place (a crash or a failed
   download leaves no half-filled cache that later runs would trust).

Later runs (and other processes) reuse the directory; concurrent first runs
both resolve and one rename wins.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

COMPLETE = ".complete"


class MavenError(RuntimeError):
    """`mvn` is missing or could not resolve a component's jars."""


def cache_root() -> Path:
    """`$KWAL_CACHE_DIR`, else `$XDG_CACHE_HOME/kwal`, else `~/.cache/kwal`."""
    explicit = os.environ.get("KWAL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kwal"


def resolved_dir(name: str) -> Path | None:
    """The jar directory of component `name` when it is already in the cache."""
    path = cache_root() / name
    return path if (path / COMPLETE).exists() else None


def _cached(pom: Path, name: str, verb: str, make: Callable[[Path, str], Path]) -> Path:
    """The cache directory of component `name`, made on first use (the steps of the module
    docstring): `make(tmp, mvn)` fills a fresh temporary directory `tmp` beside the final one
    and returns the directory to rename into place (`tmp` or one inside it); `.complete` is
    written into that last (holding the pom it came from). `verb` says what mvn does, in the error when it is missing."""
    done = resolved_dir(name)
    if done is not None:
        return done
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenError(
            f"Maven (`mvn`) is not on PATH: it is needed once to {verb} {name} from Maven "
            "Central (apt install maven)"
        )
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        made = make(tmp, mvn)
        (made / COMPLETE).write_text(pom.read_text())
        final = root / name
        try:
            made.rename(final)
        except OSError:
            if resolved_dir(name) is None:  # not another process's finished copy: a real error
                raise
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _mvn(argv: list[str], name: str, pom: Path, verb: str, timeout_s: float) -> None:
    try:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        raise MavenError(f"mvn did not {verb} {name} within {timeout_s:.0f}s") from e
    if run.returncode != 0:
        tail = "\n".join((run.stdout + run.stderr).splitlines()[-25:])
        raise MavenError(f"mvn could not {verb} {name} from {pom} (exit {run.returncode}):\n{tail}")


def resolve_jars(pom: Path, name: str, timeout_s: float = 1200.0) -> Path:
    """The directory holding every runtime jar `pom` names, resolving it on first use."""

    def make(tmp: Path, mvn: str) -> Path:
        argv = [
            mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
            "-DincludeScope=runtime", f"-DoutputDirectory={tmp}",
        ]
        _mvn(argv, name, pom, "resolve", timeout_s)
        if not any(tmp.glob("*.jar")):
            raise MavenError(f"mvn resolved no jar for {name} from {pom}")
        return tmp

    return _cached(pom, name, "download", make)


def build_app(pom: Path, name: str, runner: str, timeout_s: float = 1800.0) -> Path:
    """The build directory of an application `pom` builds with `mvn package` (holding the
    file `runner`, e.g. a Quarkus runner jar beside its `lib/`), building it on first use
    (the same cache steps as `resolve_jars`). The pom takes its build directory from
    `kwal.build.dir`, so the build writes nothing beside it (in the repository)."""

    def make(tmp: Path, mvn: str) -> Path:
        built = tmp / "build"
        argv = [mvn, "-B", "-q", "-f", str(pom), "package", "-DskipTests",
                f"-Dkwal.build.dir={built}"]
        _mvn(argv, name, pom, "build", timeout_s)
        if not (built / runner).is_file():
            raise MavenError(f"mvn built no {runner} for {name} from {pom}")
        return built

    return _cached(pom, name, "build", make)
