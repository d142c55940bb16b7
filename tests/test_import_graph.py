"""The package's import graph has no circle: every import, function-local ones included, runs one way."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (``from pkg import submodule`` counts as the submodule)."""
    files = {}
    for path in (SRC / "primal_attention").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def owner(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str | None] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("primal_attention"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    targets.append(sub if sub in files else owner(node.module))
            elif isinstance(node, ast.Import):
                targets += [owner(a.name) for a in node.names if a.name.startswith("primal_attention")]
            graph[module] |= {t for t in targets if t is not None and t != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_circle() -> None:
    graph = import_graph()
    assert len(graph) > 50 and graph["primal_attention.train.load"] >= {"primal_attention.train.config",
                                                                         "primal_attention.train.families"}
    assert circles(graph) == []


def test_a_circle_is_found() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_studies_sit_on_top_and_the_scripts_are_entry_points() -> None:
    """The library never imports the studies; scripts/ holds entry points and small tools, and nothing in
    scripts/ or tests/ loads code by path."""
    graph = import_graph()
    library = {m: deps for m, deps in graph.items() if not m.startswith("primal_attention.studies")}
    assert not [m for m, deps in library.items() if any(d.startswith("primal_attention.studies") for d in deps)]
    assert {"primal_attention.studies.sweeps", "primal_attention.studies.comparison"} <= set(graph)
    root = SRC.parent
    scripts = sorted((root / "scripts").glob("*.py"))
    assert sum(len(p.read_text().splitlines()) for p in scripts) < 1000
    by_path = ("sys.path.insert", "spec_from_file_location", "syspath_prepend")
    offenders = [str(p.relative_to(root)) for p in [*scripts, *(root / "tests").rglob("*.py")]
                 if p.name != "test_import_graph.py" and any(s in p.read_text() for s in by_path)]
    assert offenders == []
