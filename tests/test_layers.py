"""The house's layers, read from the imports (every import: top level, inside functions and
under TYPE_CHECKING alike, since each is a dependency a reader must follow).

    ops/                         the roof: `kwal` command line, ops commands, bench, demo
    tn/  producers/  consumers/  the roles
    infra/                       the ground: config, Kafka I/O, topics, object store, brokers
    schemas/                     the wire format

A package imports only its own layer and those below it, and no two modules import each
other in a loop.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYER = {"schemas": 0, "infra": 1, "tn": 2, "producers": 2, "consumers": 2, "ops": 3}


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports (a name imported from a package resolves to
    the submodule when there is one, else to the package). Importing `a.b.c` also runs the
    `__init__` of `a.b` (and `a`): those packages count as imported too, except the ones
    enclosing the importing module (Python has initialised them before it)."""
    paths = {
        _module_name(root, p): p
        for top in LAYER
        if (root / top).is_dir()
        for p in (root / top).rglob("*.py")
    }

    def resolve(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in paths}
    for mod, path in paths.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names]
            for name in targets:
                target = resolve(name)
                if target is None:
                    continue
                parts = target.split(".")
                for n in range(1, len(parts) + 1):
                    dep = ".".join(parts[:n])
                    if dep in paths and dep != mod and not mod.startswith(dep + "."):
                        graph[mod].add(dep)
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{mod} -> {dep}"
        for mod, deps in graph.items()
        for dep in deps
        if LAYER[dep.split(".")[0]] > LAYER[mod.split(".")[0]]
    )


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, deps = work[-1]
            for dep in deps:
                if dep not in index:
                    index[dep] = low[dep] = len(index)
                    stack.append(dep)
                    on_stack.add(dep)
                    work.append((dep, iter(sorted(graph[dep]))))
                    break
                if dep in on_stack:
                    low[node] = min(low[node], index[dep])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_no_import_runs_up_a_layer() -> None:
    assert upward_imports(import_graph(ROOT)) == []


def test_no_import_cycle() -> None:
    assert import_cycles(import_graph(ROOT)) == []


def test_the_checks_find_an_upward_import_and_a_cycle(tmp_path: Path) -> None:
    """The two checks above on a small tree that breaks both rules."""
    files = {
        "schemas/__init__.py": "",
        "schemas/wire.py": "from infra import config\n",
        "infra/__init__.py": "",
        "infra/config.py": "",
        "tn/__init__.py": "",
        "tn/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tn.b import B\n",
        "tn/b.py": "def f():\n    from . import a\n",
        "ops/__init__.py": "",
        "ops/cli.py": "import tn.a\n",
        # a cycle only through a package's __init__: c imports d.e, d/__init__ imports c
        "tn/c.py": "from tn.d.e import E\n",
        "tn/d/__init__.py": "from tn.c import C\n",
        "tn/d/e.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path)
    assert upward_imports(graph) == ["schemas.wire -> infra", "schemas.wire -> infra.config"]
    assert import_cycles(graph) == [["tn.a", "tn.b"], ["tn.c", "tn.d"]]
