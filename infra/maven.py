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


def resolve_jars(pom: Path, name: str, timeout_s: float = 1200.0) -> Path:
    """The directory holding every runtime jar `pom` names, resolving it on first use."""
    done = resolved_dir(name)
    if done is not None:
        return done
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenError(
            f"Maven (`mvn`) is not on PATH: it is needed once to download {name} from Maven "
            "Central (apt install maven)"
        )
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        argv = [
            mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
            "-DincludeScope=runtime", f"-DoutputDirectory={tmp}",
        ]
        try:
            run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as e:
            raise MavenError(f"mvn did not resolve {name} within {timeout_s:.0f}s") from e
        if run.returncode != 0:
            tail = "\n".join((run.stdout + run.stderr).splitlines()[-25:])
            raise MavenError(f"mvn could not resolve {name} from {pom} (exit {run.returncode}):\n{tail}")
        if not any(tmp.glob("*.jar")):
            raise MavenError(f"mvn resolved no jar for {name} from {pom}")
        (tmp / COMPLETE).write_text(pom.read_text())
        final = root / name
        try:
            tmp.rename(final)
        except OSError:
            if resolved_dir(name) is None:  # not another process's finished copy: a real error
                raise
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_app(pom: Path, name: str, runner: str, timeout_s: float = 1800.0) -> Path:
    """The build directory of an application `pom` builds with `mvn package` (holding the
    file `runner`, e.g. a Quarkus runner jar beside its `lib/`), building it on first use.
    The same steps as `resolve_jars`: a `.complete` marker, a fresh temporary directory,
    a rename into place. The pom takes its build directory from `kwal.build.dir`, so the
    build writes nothing beside it (in the repository)."""
    done = resolved_dir(name)
    if done is not None:
        return done
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenError(
            f"Maven (`mvn`) is not on PATH: it is needed once to build {name} from Maven "
            "Central (apt install maven)"
        )
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    built = tmp / "build"
    try:
        argv = [mvn, "-B", "-q", "-f", str(pom), "package", "-DskipTests",
                f"-Dkwal.build.dir={built}"]
        try:
            run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as e:
            raise MavenError(f"mvn did not build {name} within {timeout_s:.0f}s") from e
        if run.returncode != 0:
            tail = "\n".join((run.stdout + run.stderr).splitlines()[-25:])
            raise MavenError(f"mvn could not build {name} from {pom} (exit {run.returncode}):\n{tail}")
        if not (built / runner).is_file():
            raise MavenError(f"mvn built no {runner} for {name} from {pom}")
        (built / COMPLETE).write_text(pom.read_text())
        final = root / name
        try:
            built.rename(final)
        except OSError:
            if resolved_dir(name) is None:  # not another process's finished copy: a real error
                raise
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
