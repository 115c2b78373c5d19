"""The module graph of servescope, read statically with `ast`: no import cycle, no arrow between packages that
the layering forbids, no import of a servescope module (or of a name in one) that does not exist.

Layers (importer -> imported): core <- workloads <- sessions <- engine, reports <- tui, cli (the engine never
imports reports); `sim` (the simulator, a
separate program) stands apart and imports only itself. Every import counts, for the layering and for cycles:
module level, inside functions (the lazy ones) and under `if TYPE_CHECKING:` (they never run, but a cycle of
them is still two modules that cannot be read, or split, one without the other). A package's `__init__.py` is that package; `servescope/__main__.py` belongs to the CLI;
`servescope/__init__.py` (the version) may be imported by anyone."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

PKG_DIR = Path(__file__).resolve().parents[1] / "servescope"
ROOT = "servescope"

# package -> the packages it may import (besides itself and the root `servescope`)
ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "workloads": frozenset({"core"}),
    "sessions": frozenset({"workloads", "core"}),
    "reports": frozenset({"sessions", "workloads", "core"}),
    "engine": frozenset({"sessions", "workloads", "core", "sim"}),
    "tui": frozenset({"engine", "reports", "sessions", "workloads", "core", "sim"}),
    "cli": frozenset({"engine", "reports", "sessions", "tui", "workloads", "sim", "core"}),
    "sim": frozenset(),
}


@dataclass(frozen=True)
class Edge:
    src: str  # importing module
    dst: str  # imported module (a package means its __init__.py)
    file: str  # path relative to the repository
    line: int
    typing_only: bool  # under `if TYPE_CHECKING:`

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, typing_only: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement anywhere in the tree, with whether it only runs for the type checker."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, typing_only
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), True)
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), typing_only)
        else:
            yield from _imports(node, typing_only)


def _defined_names(tree: ast.Module) -> set[str] | None:
    """The names a module binds at its top level (None: any name, it has `import *` or `__getattr__`)."""
    names: set[str] = set()
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for a in node.names:
                if a.name == "*":
                    return None
                names.add(a.asname or a.name.split(".")[0])
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For):
            targets = [node.target]
        elif isinstance(node, ast.With):
            targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
        names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        if isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
            for field in ("body", "orelse", "finalbody"):
                todo.extend(getattr(node, field, []))
            for h in getattr(node, "handlers", []):
                todo.extend(h.body)
    return names


@cache
def graph() -> tuple[frozenset[str], tuple[Edge, ...], tuple[str, ...]]:
    """(modules, edges, unresolved imports as 'file:line: name')."""
    files = {_module_name(p): p for p in sorted(PKG_DIR.rglob("*.py"))}
    trees = {m: ast.parse(p.read_text(encoding="utf-8"), filename=str(p)) for m, p in files.items()}
    defined = {m: _defined_names(t) for m, t in trees.items()}
    modules = frozenset(files)
    edges: list[Edge] = []
    unresolved: dict[str, None] = {}
    for mod, path in files.items():
        rel = path.relative_to(PKG_DIR.parent).as_posix()
        for node, typing_only in _imports(trees[mod]):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name == ROOT or a.name.startswith(ROOT + ".")]
            else:
                if node.level:
                    base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                if origin != ROOT and not origin.startswith(ROOT + "."):
                    continue
                for alias in node.names:  # `from pkg import sub` imports the submodule when there is one
                    sub = f"{origin}.{alias.name}"
                    if sub in modules:
                        targets.append(sub)
                        continue
                    names = defined.get(origin, set())
                    if origin in modules and names is not None and alias.name not in names:
                        unresolved[f"{rel}:{node.lineno}: {sub}"] = None
                    targets.append(origin)
            for t in targets:
                if t not in modules:
                    unresolved[f"{rel}:{node.lineno}: {t}"] = None
                elif t != mod:
                    edges.append(Edge(mod, t, rel, node.lineno, typing_only))
    return modules, tuple(edges), tuple(unresolved)


def _layer(mod: str) -> str | None:
    parts = mod.split(".")
    if len(parts) == 1:
        return None  # servescope/__init__.py
    return "cli" if parts[1] == "__main__" else parts[1]


def _cycles(nodes: frozenset[str], edges: list[Edge]) -> list[list[Edge]]:
    """One cycle (as its edges) for each strongly connected component with more than one module."""
    out: dict[str, dict[str, Edge]] = {n: {} for n in nodes}
    for e in edges:
        out[e.src].setdefault(e.dst, e)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[set[str]] = []

    def strongconnect(v: str) -> None:  # Tarjan; the graph is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in out[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    for n in sorted(nodes):
        if n not in index:
            strongconnect(n)

    cycles = []
    for comp in sccs:
        start = min(comp)
        # shortest path back to `start` inside the component (BFS)
        prev: dict[str, Edge] = {}
        frontier = [start]
        while frontier and start not in prev:
            nxt = []
            for v in frontier:
                for w, e in sorted(out[v].items()):
                    if w in comp and w not in prev:
                        prev[w] = e
                        nxt.append(w)
            frontier = nxt
        path: list[Edge] = []
        v = start
        while True:
            e = prev[v]
            path.append(e)
            v = e.src
            if v == start:
                break
        cycles.append(path[::-1])
    return cycles


def test_the_graph_is_read() -> None:
    modules, edges, _ = graph()
    assert "servescope.core.client" in modules and "servescope.tui.app" in modules
    assert any(e.src == "servescope.core.load" and e.dst == "servescope.core.client" for e in edges)
    assert any(e.typing_only for e in edges)  # `if TYPE_CHECKING:` blocks are seen


def test_no_import_cycles() -> None:
    modules, edges, _ = graph()
    cycles = _cycles(modules, list(edges))
    report = [" -> ".join([c[0].src] + [f"{e.dst} ({e.where})" for e in c]) for c in cycles]
    assert not report, "import cycles:\n" + "\n".join(report)


def _forbidden(edges: tuple[Edge, ...] | list[Edge]) -> list[str]:
    bad = []
    for e in edges:
        src, dst = _layer(e.src), _layer(e.dst)
        if dst is None or src == dst:
            continue
        if src is None or dst not in ALLOWED.get(src, frozenset()):
            bad.append(f"{e.where}: {e.src} -> {e.dst} ({src or ROOT} may not import {dst})")
    return bad


def test_packages_import_only_the_layers_below() -> None:
    _, edges, _ = graph()
    bad = _forbidden(edges)
    assert not bad, "forbidden imports:\n" + "\n".join(bad)


def test_the_checks_catch_what_they_should() -> None:
    def e(src: str, dst: str, typing_only: bool = False) -> Edge:
        return Edge(f"servescope.{src}", f"servescope.{dst}", "f.py", 1, typing_only)

    edges = [e("a.x", "a.y"), e("a.y", "a.z"), e("a.z", "a.x"), e("b", "a.x")]
    nodes = frozenset(x for ed in edges for x in (ed.src, ed.dst))
    (cycle,) = _cycles(nodes, edges)
    assert [ed.src for ed in cycle] == ["servescope.a.x", "servescope.a.y", "servescope.a.z"]
    assert not _cycles(nodes, edges[:2] + edges[3:])
    typed = [*edges[:2], e("a.z", "a.x", typing_only=True)]  # a cycle through a TYPE_CHECKING import is one too
    assert len(_cycles(nodes, typed)) == 1
    bad = [e("core.load", "tui.app", typing_only=True), e("core.load", "workloads.spec"),
           e("sessions.store", "engine.runner"), e("engine.runner", "tui.app"), e("sim.server", "core.client"),
           e("workloads.spec", "tui"), e("tui.app", "cli.run")]
    assert len(_forbidden(bad)) == len(bad)
    fine = [e("cli.run", "engine.runner"), e("__main__", "tui.app"), e("core.load", "core.client"),
            e("sim.cli", "sim.server"), e("workloads.spec", "core.errors"), e("tui.app", "sim"),
            Edge("servescope.core.load", ROOT, "f.py", 1, False)]
    assert not _forbidden(fine)


def test_every_servescope_import_names_something_that_exists() -> None:
    _, _, unresolved = graph()
    assert not unresolved, "imports of missing servescope modules or names:\n" + "\n".join(unresolved)


def test_every_package_has_a_layer() -> None:
    modules, _, _ = graph()
    layers = {_layer(m) for m in modules} - {None}
    assert layers <= set(ALLOWED), layers - set(ALLOWED)


# ---- the house's two budgets (issue: one result model) ------------------------------------------------------
# A servescope import inside a function is kept only where it keeps a heavy library (polars, httpx, textual,
# aiohttp) off a start-up path: `servescope --help`, the app's first frame, the simulator's command line
# (benchmarks/import_cost.py prints what each path loads and what each library costs). `dict[str, Any]` is
# for data whose shape nobody knows; the known shapes are Structs, TypedDicts or dataclasses.
MAX_IMPORTS_IN_FUNCTIONS = 60
MAX_ANY_DICTS = 40


def _imports_in_functions(tree: ast.AST) -> list[int]:
    lines: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for sub in node.body:
                for n in ast.walk(sub):
                    if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(ROOT) and n.level == 0 or (
                            isinstance(n, ast.Import) and any(a.name.startswith(ROOT) for a in n.names)):
                        lines.append(n.lineno)
    return sorted(set(lines))  # a nested function's import is walked twice


def test_servescope_imports_inside_functions_stay_few() -> None:
    found = [f"{p.relative_to(PKG_DIR.parent)}:{line}" for p in sorted(PKG_DIR.rglob("*.py"))
             for line in _imports_in_functions(ast.parse(p.read_text()))]
    assert len(found) < MAX_IMPORTS_IN_FUNCTIONS, "\n".join(found)


def test_untyped_dicts_stay_few() -> None:
    found = [f"{p.relative_to(PKG_DIR.parent)}:{i}" for p in sorted(PKG_DIR.rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if "dict[str, Any]" in line]
    assert len(found) < MAX_ANY_DICTS, "\n".join(found)


def test_the_budget_counters_count() -> None:
    tree = ast.parse("def f():\n    from servescope.core import metrics\n    def g():\n        import servescope.sim\n"
                     "import servescope.core\n")
    assert _imports_in_functions(tree) == [2, 4]
