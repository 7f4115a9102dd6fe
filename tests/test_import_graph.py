"""The import graph of ``src/twotower``: no circles, no floor importing the floor above it, no library module
importing the CLI.

What counts as an edge ``A → B`` (``A`` and ``B`` modules of the package; a package is its ``__init__``):

- every ``import`` / ``from … import`` statement anywhere in ``A``'s syntax tree: at module level, inside a function
  (a lazy import is still a dependency for a reader), and under ``if TYPE_CHECKING:`` (an annotation names a type the
  reader must look up: two modules that only type-check against each other are still one idea split in two);
- relative imports resolve against ``A``'s package; ``import a.b.c`` and ``from a.b import c`` (``c`` a module) name
  the deepest module that exists, ``a.b.c`` — the package ``__init__``s that run on the way are not edges (they are a
  side effect of the file layout, not a choice of ``A``'s author);
- a name a package re-exports resolves to the module that defines it: ``from twotower import Reranker`` and
  ``import twotower as tt; tt.Reranker`` are edges to ``twotower.retrieval.rerank`` (re-exports read from the
  package's ``from … import`` statements and from a ``{"Name": "twotower.module"}`` table such as
  ``twotower._EXPORTS``); a name it makes on the fly (a ``__getattr__`` without an import of it) is an edge to the
  package itself;
- ``importlib.import_module(name)`` with a computed name is not an edge (the top-level lazy exports: a reader
  follows the table, and the table's entries are resolved as above).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "twotower"

# The cycles still in the package: the test requires the cycles found to be exactly these, so a new cycle fails and a
# fixed one forces its entry out of this set. None are left (issue #46: the local and the Milvus backends implement
# retrieval.store_protocol.Store side by side; retrieval.backends picks one and neither imports it back).
KNOWN_CYCLES: set[frozenset[str]] = set()

# The floors, bottom up (docs/project/architecture.md): a module imports its own floor and the floors below.
FLOORS: dict[str, int] = {
    "twotower.errors": 0, "twotower.io": 0, "twotower.outputs": 0, "twotower.checks": 0,
    "twotower.progress": 0,
    "twotower.data": 1, "twotower.encoders": 2, "twotower.retrieval": 3,
    "twotower.training": 4, "twotower.evaluation": 4, "twotower.serve": 4, "twotower.scale": 4,
    "twotower.analysis": 5, "twotower.api": 6, "twotower": 6, "twotower.integrations": 7,
    "twotower.cli": 8,
}
API_FLOOR = FLOORS["twotower.api"]

# Imports that climb a floor, left as they are for now: listed so that a new one fails. None are left (issue #46:
# language detection lies in data.language, beneath the encoders and BM25; the hybrid's λ tuning, which scores runs
# with the evaluation's metrics, lies in evaluation.tuning).
KNOWN_UPWARD: set[str] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def deepest_known(target: str, known: set[str]) -> str:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target


def absolute(node: ast.ImportFrom, package: str) -> str:
    """The module an ``ImportFrom`` reads from, with a relative one resolved against ``package``."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def reexports(tree: ast.AST, name: str, known: set[str]) -> dict[str, str]:
    """The names the package ``name`` (its ``__init__``'s tree) hands on, each with the module it comes from."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = absolute(node, name)
            for alias in node.names:
                found[alias.asname or alias.name] = deepest_known(f"{base}.{alias.name}", known) or base
        elif isinstance(node, ast.Dict):  # a lazy-export table: {"Index": "twotower.api.index", ...}
            for key, value in zip(node.keys, node.values):
                if (isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Constant)
                        and value.value in known):
                    found[key.value] = value.value
    return found


class ImportWalker:
    """Builds the graph. ``sources``: module name -> its source; ``packages``: the names that are packages."""

    def __init__(self, sources: dict[str, str], packages: set[str]):
        self.trees = {name: ast.parse(text, filename=name) for name, text in sources.items()}
        self.known = set(sources)
        self.packages = packages
        self.exports = {name: reexports(self.trees[name], name, self.known) for name in packages}

    def resolve(self, package: str, attribute: str) -> str:
        """The module behind ``package.attribute``: a submodule, a re-export's origin, else the package."""
        if f"{package}.{attribute}" in self.known:
            return f"{package}.{attribute}"
        origin = self.exports.get(package, {}).get(attribute)
        if origin is None or origin == package:
            return package
        return self.resolve(origin, attribute) if origin in self.packages else origin

    def imports_of(self, name: str) -> set[str]:
        tree = self.trees[name]
        package = name if name in self.packages else name.rpartition(".")[0]
        found: set[str] = set()
        bound: dict[str, str] = {}  # `import twotower as tt`: tt -> twotower (for tt.Name below)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = deepest_known(alias.name, self.known)
                    if target:
                        found.add(target)
                        if alias.asname or "." not in alias.name:
                            bound[alias.asname or alias.name] = target
            elif isinstance(node, ast.ImportFrom):
                base = absolute(node, package)
                if deepest_known(base, self.known) != base:
                    continue  # not one of ours (numpy, typing, ...)
                found.update(self.resolve(base, alias.name) for alias in node.names)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and bound[node.value.id] in self.packages):
                found.add(self.resolve(bound[node.value.id], node.attr))
        found.discard(name)
        return found

    def graph(self) -> dict[str, set[str]]:
        return {name: self.imports_of(name) for name in self.trees}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    packages = {name for name, p in files.items() if p.name == "__init__.py"}
    return ImportWalker({name: p.read_text() for name, p in files.items()}, packages).graph()


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


def floor(module: str) -> int:
    """The floor of ``module``: that of the longest prefix in FLOORS."""
    prefix = module
    while prefix not in FLOORS:
        if "." not in prefix:
            raise AssertionError(f"{module} lies on no floor: add its package to FLOORS")
        prefix = prefix.rpartition(".")[0]
    return FLOORS[prefix]


def upward_edges(graph: dict[str, set[str]], into: int | None = None, below: int | None = None) -> list[str]:
    """Every edge from a module on a floor under ``below`` to one on a floor ``into`` or higher; with neither
    given, every edge to a higher floor than its own."""
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if floor(b) > floor(a) and (below is None or floor(a) < below) and (into is None or floor(b) >= into))


def walk(modules: dict[str, str]) -> dict[str, set[str]]:
    packages = {name for name in modules if any(other.startswith(name + ".") for other in modules)}
    return ImportWalker(modules, packages).graph()


def test_graph_sees_module_function_and_type_checking_imports():
    """The walker itself: relative, absolute, `from pkg import module`, function-level and TYPE_CHECKING imports."""
    graph = walk({
        "tw": "", "tw.a": "", "tw.b": "", "tw.c": "", "tw.sub": "", "tw.sub.d": "", "tw.sub.f": "",
        "tw.sub.e": ("import tw.a\n"
                     "from . import f\n"            # tw.sub.f
                     "def g():\n"
                     "    from tw.sub.d import thing\n"
                     "    from ..c import other\n"  # tw.c
                     "import numpy\n"
                     "from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n"
                     "    from tw.b import T\n"),
    })
    assert graph["tw.sub.e"] == {"tw.a", "tw.sub.f", "tw.sub.d", "tw.c", "tw.b"}
    assert graph["tw.a"] == set()


def test_graph_follows_reexports_to_the_defining_module():
    graph = walk({
        "tw": 'EXPORTS = {"Thing": "tw.deep.thing", "Other": "tw.deep"}\n',
        "tw.deep": "from tw.deep.thing import Thing, helper as renamed\ndef __getattr__(name):\n    return 1\n",
        "tw.deep.thing": "",
        "tw.user": "from tw import Thing\nfrom tw.deep import renamed, made_on_the_fly\n",
        "tw.lazy": "def f():\n    import tw as t\n    return t.Thing, t.deep\n",
        "tw.plain": "import tw.deep.thing\n",
    })
    assert graph["tw.user"] == {"tw.deep.thing", "tw.deep"}  # renamed -> thing; made_on_the_fly -> the package
    assert graph["tw.lazy"] == {"tw", "tw.deep.thing", "tw.deep"}
    assert graph["tw.plain"] == {"tw.deep.thing"}  # the packages on the way are not edges
    assert graph["tw"] == set()  # a lazy-export table is resolved where it is used, not an edge of the table


def test_find_cycles_reports_a_two_module_cycle_and_a_longer_one():
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(find_cycles(graph)) == [["a", "b"], ["c", "d", "e"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_floors_and_upward_edges():
    assert floor("twotower.training.fit.run") == FLOORS["twotower.training"]
    assert floor("twotower.cli.search") == floor("twotower.cli") == FLOORS["twotower.cli"]
    assert floor("twotower.retrieval.commands") == FLOORS["twotower.retrieval"]  # commands live in twotower.cli
    assert floor("twotower") == API_FLOOR
    graph = {"twotower.training.pipeline": {"twotower.api.dataset", "twotower.data.beir"},
             "twotower.api.index": {"twotower.retrieval.store"}}
    assert upward_edges(graph, into=API_FLOOR, below=API_FLOOR) == [
        "twotower.training.pipeline -> twotower.api.dataset"]
    assert upward_edges({"twotower.encoders.x": {"twotower.retrieval.y", "twotower.data.z", "twotower.encoders.w"}}) \
        == ["twotower.encoders.x -> twotower.retrieval.y"]


def test_graph_covers_the_package():
    graph = import_graph()
    assert "twotower.encoders.towers" in graph and "twotower.training.trainer" in graph
    # known one-way edges, as a check that the walk finds real imports
    assert "twotower.encoders.encoder" in graph["twotower.encoders.towers"]
    assert "twotower.api.index" in graph["twotower.integrations.search"]
    for name in graph:
        floor(name)  # every module lies on a floor


def test_no_import_cycles_beyond_the_known_ones():
    found = {frozenset(c) for c in find_cycles(import_graph())}
    new = ["  " + " <-> ".join(sorted(c)) for c in found - KNOWN_CYCLES]
    fixed = ["  " + " <-> ".join(sorted(c)) for c in KNOWN_CYCLES - found]
    assert not new, "import cycles between twotower modules:\n" + "\n".join(new)
    assert not fixed, "these cycles are gone: delete them from KNOWN_CYCLES:\n" + "\n".join(fixed)


def test_nothing_below_the_api_imports_it():
    """The library's floors never call up into ``twotower.api`` (nor the package top, which re-exports it)."""
    assert upward_edges(import_graph(), into=API_FLOOR, below=API_FLOOR) == []


def test_library_modules_never_import_the_cli():
    assert upward_edges(import_graph(), into=FLOORS["twotower.cli"], below=FLOORS["twotower.cli"]) == []


def test_imports_go_down_the_floors():
    """data → encoders → retrieval → training/evaluation/serve/scale → analysis → api → cli: a module imports its own
    floor and the ones below, never one above (beyond the KNOWN_UPWARD left for later)."""
    found = set(upward_edges(import_graph()))
    assert sorted(found - KNOWN_UPWARD) == [], "imports that climb a floor"
    assert sorted(KNOWN_UPWARD - found) == [], "these imports are gone: delete them from KNOWN_UPWARD"
