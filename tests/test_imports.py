"""Imports between twotower's own modules go one way: no module imports (at module level or inside a function)
a module that imports it back, directly or through others."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "twotower"

# Cycles another branch removes; the merger deletes an entry once that branch is in.
KNOWN_CYCLES: set[frozenset[str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The twotower modules that ``tree`` (the module ``name``) imports anywhere in its body, except under
    ``if TYPE_CHECKING:`` (annotations only: never run, so never a cycle)."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    typing_only = {id(n) for block in ast.walk(tree)
                   if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                   for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from twotower.encoders import io` imports the module twotower.encoders.io
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            # `import twotower.encoders.io` also runs the packages above it; count the deepest known module
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(files)
    return {name: imported_modules(ast.parse(path.read_text(), filename=str(path)), name,
                                   path.name == "__init__.py", known)
            for name, path in files.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def test_graph_sees_module_and_function_level_imports():
    """The parser itself: relative, absolute, `from pkg import module` and function-level imports all count."""
    known = {"twotower", "twotower.a", "twotower.b", "twotower.c", "twotower.sub", "twotower.sub.d"}
    source = (
        "import twotower.a\n"
        "from . import b\n"
        "def f():\n"
        "    from twotower.sub.d import thing\n"
        "    from .c import other\n"
        "import numpy\n"
    )
    # relative to the package of a module in twotower.sub: `from . import b` means twotower.sub.b (unknown here,
    # so the package twotower.sub), `from .c` means twotower.sub.c (unknown: twotower.sub)
    assert imported_modules(ast.parse(source), "twotower.sub.e", False, known) == {
        "twotower.a", "twotower.sub", "twotower.sub.d"}
    # at the top level the same relative imports name twotower.b and twotower.c
    assert imported_modules(ast.parse(source), "twotower.e", False, known) == {
        "twotower.a", "twotower.b", "twotower.c", "twotower.sub.d"}
    # imports for annotations only (never executed) are not edges
    typed = "from typing import TYPE_CHECKING\nimport twotower.a\nif TYPE_CHECKING:\n    from twotower.c import T\n"
    assert imported_modules(ast.parse(typed), "twotower.e", False, known) == {"twotower.a"}


def test_find_cycles_reports_a_two_module_cycle_and_a_longer_one():
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(find_cycles(graph)) == [["a", "b"], ["c", "d", "e"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_graph_covers_the_package():
    graph = import_graph()
    assert "twotower.encoders.towers" in graph and "twotower.training.trainer" in graph
    # a known one-way edge, as a check that the walk finds real imports
    assert "twotower.encoders.encoder" in graph["twotower.encoders.towers"]


def test_no_import_cycles():
    cycles = [c for c in find_cycles(import_graph()) if frozenset(c) not in KNOWN_CYCLES]
    assert not cycles, "import cycles between twotower modules:\n" + "\n".join(" <-> ".join(c) for c in cycles)
