"""The import architecture, checked statically (the layers are explained in docs/architecture.md).

Every ``.py`` file of the five project packages is parsed with :mod:`ast` -- nothing is imported -- and
every import statement counts: top level, lazy (inside a function), under ``if TYPE_CHECKING:``, inside
``try``. Relative imports are resolved; ``from pkg import name`` is an import of ``pkg`` and, when
``pkg.name`` is a module, of that module too; each name is resolved to the longest project module that
prefixes it. A module-level dict literal ``_EXPORTS = {"name": "defining.module"}`` (the lazy PEP 562
face of ``engine``) counts as an import of each of its values.

The rules: no import cycles; layers import downwards only (hardware_profiles < algorithms < engine <
sweeps < hetsim), and so do the layers inside ``engine`` (``ENGINE_LAYERS``); the upper layers take only
the face's names from ``engine`` (plumbing comes from its own module); ``ray`` is imported only in
``engine/ray/`` and ``sweeps/``; engine modules never import the face; a lazy import says why in a
comment; a file over 400 lines says why in its docstring.
"""
from __future__ import annotations

import ast
import io
import tokenize
from collections import defaultdict, deque
from dataclasses import dataclass
from functools import cache
from itertools import pairwise
from pathlib import Path

import pytest
from helpers import REPO

PACKAGES = ("hardware_profiles", "algorithms", "engine", "sweeps", "hetsim")  # lowest layer first
RANK = {package: rank for rank, package in enumerate(PACKAGES)}
RAY_HOMES = ("engine.ray", "sweeps")
LONG_FILE = 400
# The engine's own layers, lowest first (docs/architecture.md): a module may import its own layer and
# those below it. The face ``engine`` is the top; a name not listed is the foundation (atomic, cache, ...).
ENGINE_LAYERS = (
    ("engine.config",),
    ("engine.data", "engine.models"),
    ("engine.clients",),
    ("engine.execution",),
    ("engine.loop",),
    ("engine.results",),
    ("engine.checkpoint",),
    ("engine.ray",),
    ("engine.run",),
    ("engine.plugins",),  # the extension API's face: it re-exports the contracts of every layer
)


@dataclass(frozen=True)
class Module:
    name: str
    file: str  # relative to the root, posix
    source: str
    tree: ast.Module

    @property
    def package(self) -> str:
        """The package that relative imports of this module start from."""
        return self.name if self.file.endswith("__init__.py") else self.name.rpartition(".")[0]


@dataclass(frozen=True)
class Import:
    importer: str
    target: str  # a project module, or the third-party name as written
    file: str
    line: int
    end_line: int
    lazy: bool  # inside a function or method body
    internal: bool  # target is a project module

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.importer} imports {self.target}"


@dataclass(frozen=True)
class Graph:
    modules: dict[str, Module]
    imports: list[Import]

    def edges(self) -> dict[str, dict[str, Import]]:
        """importer -> imported project module -> the first import that makes that edge."""
        out: dict[str, dict[str, Import]] = {name: {} for name in self.modules}
        for imp in sorted(self.imports, key=lambda i: (i.file, i.line)):
            if imp.internal:
                out[imp.importer].setdefault(imp.target, imp)
        return out


# --- collecting -----------------------------------------------------------------------------------


def collect(root: Path, packages: tuple[str, ...]) -> Graph:
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                continue
            parts = rel.with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            source = path.read_text(encoding="utf-8")
            modules[name] = Module(name, rel.as_posix(), source, ast.parse(source, str(rel)))
    imports = [imp for module in modules.values() for imp in _imports_of(module, modules, packages)]
    return Graph(modules, imports)


def _imports_of(module: Module, modules: dict[str, Module], packages: tuple[str, ...]):
    def make(name: str, node: ast.AST, lazy: bool) -> Import | None:
        internal = name.split(".")[0] in packages
        target = _longest_module_prefix(name, modules) if internal else name
        if target == module.name:
            return None  # e.g. ``from . import sub`` in a package's __init__: not an edge
        end = getattr(node, "end_lineno", None) or node.lineno
        return Import(module.name, target, module.file, node.lineno, end, lazy, internal)

    found = []
    for node, lazy in _import_statements(module.tree):
        for name in _imported_names(node, module, modules):
            found.append(make(name, node, lazy))
    for name, node in _exports(module.tree):
        found.append(make(name, node, lazy=False))
    return [imp for imp in found if imp is not None]


def _import_statements(node: ast.AST, in_function: bool = False):
    """Every Import/ImportFrom under ``node``, with whether it sits inside a function body."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, in_function
        nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from _import_statements(child, nested)


def _imported_names(node: ast.Import | ast.ImportFrom, module: Module, modules) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.package.split(".")
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
    return submodules + [base]


def _exports(tree: ast.Module):
    """(module, value node) for each value of a module-level ``_EXPORTS = {...}`` dict literal."""
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
        value = getattr(stmt, "value", None)
        if not isinstance(value, ast.Dict) or not any(getattr(t, "id", None) == "_EXPORTS" for t in targets):
            continue
        for item in value.values:
            if isinstance(item, ast.Constant) and isinstance(item.value, str):
                yield item.value, item


def _longest_module_prefix(name: str, modules) -> str:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return parts[0]


# --- checks (shared by the real tests and the self-tests) -----------------------------------------


def find_cycles(graph: Graph) -> list[list[str]]:
    """Import cycles as ``[a, b, ..., a]``, each starting at its smallest module.

    Not every elementary cycle (there can be exponentially many): for each edge that lies on a cycle,
    the shortest cycle through it -- so every edge that takes part in a cycle is reported at least once.
    """
    edges = graph.edges()
    cycles = set()
    for source in sorted(edges):
        for target in sorted(edges[source]):
            back = _shortest_path(edges, target, source)
            if back is None:
                continue
            ring = [source, *back[:-1]]
            start = ring.index(min(ring))
            cycles.add(tuple(ring[start:] + ring[:start] + [ring[start]]))
    return [list(cycle) for cycle in sorted(cycles)]


def _shortest_path(edges: dict[str, dict[str, Import]], start: str, goal: str) -> list[str] | None:
    """Breadth-first: ``[start, ..., goal]``, or None when ``goal`` cannot be reached."""
    previous: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue and goal not in previous:
        node = queue.popleft()
        for child in sorted(edges.get(node, {})):
            if child not in previous:
                previous[child] = node
                queue.append(child)
    if goal not in previous:
        return None
    path = [goal]
    while path[-1] != start:
        path.append(previous[path[-1]])
    return path[::-1]


def format_cycle(graph: Graph, cycle: list[str]) -> str:
    edges = graph.edges()
    hops = [f"      {edges[a][b]}" for a, b in pairwise(cycle)]
    return "\n".join([" -> ".join(cycle)] + hops)


def lazy_imports_without_reason(graph: Graph) -> list[str]:
    """Imports inside a function body with no ``#`` comment giving their reason: on their own
    lines, or above them. Imports stacked together (blank lines between them allowed, as isort
    groups them) share the comment above the first: the nearest non-blank line above the
    block (a comment line, or the trailing comment of an ``if ...:`` header)."""
    offenders, seen = [], set()
    import_lines: dict[str, set[int]] = defaultdict(set)
    for imp in graph.imports:
        import_lines[imp.file].update(range(imp.line, imp.end_line + 1))
    for imp in sorted(graph.imports, key=lambda i: (i.file, i.line)):
        if not imp.lazy or (imp.file, imp.line) in seen:
            continue
        seen.add((imp.file, imp.line))
        module = graph.modules[imp.importer]
        lines = module.source.splitlines()
        comments = _comment_lines(module.source)
        block = set(range(imp.line, imp.end_line + 1))
        above = imp.line - 1
        while above > 0 and (not lines[above - 1].strip() or above in import_lines[imp.file]):
            block.add(above)
            above -= 1
        if not comments & {above, *block}:
            offenders.append(f"{imp.file}:{imp.line}: {lines[imp.line - 1].strip()}")
    return offenders


@cache
def _comment_lines(source: str) -> frozenset[int]:
    """The numbers of the lines that carry a ``#`` comment (tokenized: a ``#`` in a string is none)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return frozenset(token.start[0] for token in tokens if token.type == tokenize.COMMENT)


def long_files_without_reason(graph: Graph, limit: int = LONG_FILE) -> list[str]:
    offenders = []
    for module in sorted(graph.modules.values(), key=lambda m: m.file):
        length = len(module.source.splitlines())
        docstring = " ".join((ast.get_docstring(module.tree) or "").split())
        if length > limit and f"{limit} lines" not in docstring:
            offenders.append(f"{module.file}: {length} lines")
    return offenders


def _layer(module: str) -> str:
    return module.split(".")[0]


def _within(module: str, packages) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def upward_imports(graph: Graph, layers: tuple[tuple[str, ...], ...], face: str) -> list[Import]:
    """Imports between modules of ``face``'s package that go to a higher layer of ``layers``."""
    def rank(module: str) -> int:
        if module == face:
            return len(layers) + 1
        return next((i + 1 for i, layer in enumerate(layers) if _within(module, layer)), 0)

    return [
        imp
        for imp in graph.imports
        if imp.internal and _within(imp.importer, [face]) and _within(imp.target, [face])
        and rank(imp.target) > rank(imp.importer)
    ]


def _fail_if_any(offenders: list, headline: str) -> None:
    if offenders:
        pytest.fail(f"{headline} ({len(offenders)}):\n  " + "\n  ".join(map(str, offenders)), pytrace=False)


# --- the project's rules --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> Graph:
    return collect(REPO, PACKAGES)


def test_no_import_cycles(graph):
    cycles = [format_cycle(graph, cycle) for cycle in find_cycles(graph)]
    _fail_if_any(cycles, "import cycles, each with the import that makes each step")


def test_layers_import_downwards_only(graph):
    order = " < ".join(PACKAGES)
    upward = [imp for imp in graph.imports if imp.internal and RANK[_layer(imp.target)] > RANK[_layer(imp.importer)]]
    _fail_if_any(upward, f"imports of a higher layer (layers: {order})")


def test_engine_layers_import_downwards_only(graph):
    order = " < ".join("/".join(layer) for layer in ENGINE_LAYERS)
    upward = upward_imports(graph, ENGINE_LAYERS, "engine")
    _fail_if_any(upward, f"engine modules importing a higher engine layer (foundation < {order} < face)")


def face_names(graph: Graph) -> set[str]:
    """The names of the face ``engine`` (its ``_EXPORTS`` table), read from its source."""
    tree = graph.modules["engine"].tree
    table = next(stmt.value for stmt in tree.body if isinstance(stmt, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in stmt.targets))
    return {key.value for key in table.keys}


def names_taken_from_the_face(module: Module) -> list[tuple[int, str]]:
    """(line, name) for each name ``module`` takes from ``engine`` itself: ``from engine import
    name`` and ``engine.name`` after ``import engine`` (not ``engine.sub`` modules' names)."""
    out = []
    plain = False
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom) and node.module == "engine" and node.level == 0:
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import) and any(a.name == "engine" and a.asname is None for a in node.names):
            plain = True
    if plain:
        out += [(node.lineno, node.attr) for node in ast.walk(module.tree)
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "engine"]
    return out


def test_upper_layers_take_only_the_face_names_from_the_face(graph):
    face = face_names(graph)
    subpackages = {name.split(".")[1] for name in graph.modules if name.startswith("engine.")}
    stray = [f"{module.file}:{line}: engine.{name}" for module in graph.modules.values()
             if _layer(module.name) in ("sweeps", "hetsim")
             for line, name in names_taken_from_the_face(module) if name not in face | subpackages]
    assert not stray, ("sweeps/hetsim take plumbing through the face (import it from the module that "
                       "defines it):\n" + "\n".join(stray))


def test_face_check_finds_plumbing_taken_through_the_face(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "__init__.py").write_text('_EXPORTS = {"simulate": "engine.api"}\n')
    (tmp_path / "engine" / "api.py").write_text("def simulate(): pass\n")
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "__init__.py").write_text("")
    (tmp_path / "sweeps" / "a.py").write_text("import engine\nfrom engine import simulate, init_ray\n"
                                              "engine.execute_run()\nengine.api.simulate()\n")
    small = collect(tmp_path, ("engine", "sweeps"))
    assert face_names(small) == {"simulate"}
    taken = names_taken_from_the_face(small.modules["sweeps.a"])
    assert sorted(name for _, name in taken if name not in face_names(small) | {"api"}) == ["execute_run", "init_ray"]


def test_ray_stays_in_engine_ray_and_sweeps(graph):
    stray = [
        imp
        for imp in graph.imports
        if not imp.internal and _layer(imp.target) == "ray" and not _within(imp.importer, RAY_HOMES)
    ]
    _fail_if_any(stray, "ray imported outside engine/ray/ and sweeps/")


def test_engine_modules_do_not_import_the_face(graph):
    inward = [imp for imp in graph.imports if _within(imp.importer, ["engine"]) and imp.target == "engine"]
    _fail_if_any(inward, "engine modules importing the engine face (import the defining submodule)")


def test_lazy_imports_give_a_reason(graph):
    _fail_if_any(lazy_imports_without_reason(graph), "imports inside functions without a '#' reason")


def test_long_files_state_why(graph):
    offenders = long_files_without_reason(graph)
    _fail_if_any(offenders, f"files over {LONG_FILE} lines whose docstring does not say why ('{LONG_FILE} lines')")


# --- self-tests: the checker can fail --------------------------------------------------------------


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")


def test_checker_finds_a_cycle_and_an_unexplained_lazy_import(tmp_path):
    _write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "import pkg.b\n",
            "pkg/b.py": "def f():\n    import pkg.a\n",
            "pkg/c.py": "def f():\n    # heavy\n\n    import os\n    import sys  # slow\n"
            "    if os:  # rare\n        import json\n",
        },
    )
    graph = collect(tmp_path, ("pkg",))
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]
    assert format_cycle(graph, ["pkg.a", "pkg.b", "pkg.a"]).splitlines()[1:] == [
        "      pkg/a.py:1: pkg.a imports pkg.b",
        "      pkg/b.py:2: pkg.b imports pkg.a",
    ]
    assert lazy_imports_without_reason(graph) == ["pkg/b.py:2: import pkg.a"]


def test_checker_resolves_relative_from_type_checking_and_exports(tmp_path):
    _write_tree(
        tmp_path,
        {
            "pkg/__init__.py": '_EXPORTS = {"thing": "pkg.sub.deep"}\n',
            "pkg/sub/__init__.py": "",
            "pkg/sub/deep.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import top\n",
            "pkg/sub/other.py": "from . import deep, NAME\nfrom .deep import x\n"
            "try:\n    import ray.tune\nexcept ImportError:\n    pass\n",
            "pkg/top.py": "from pkg.sub import other\n",
        },
    )
    edges = {(i.importer, i.target, i.line) for i in collect(tmp_path, ("pkg",)).imports}
    assert edges == {
        ("pkg", "pkg.sub.deep", 1),
        ("pkg.sub.deep", "typing", 1),
        ("pkg.sub.deep", "pkg.top", 3),
        ("pkg.sub.deep", "pkg", 3),
        ("pkg.sub.other", "pkg.sub.deep", 1),
        ("pkg.sub.other", "pkg.sub", 1),
        ("pkg.sub.other", "pkg.sub.deep", 2),
        ("pkg.sub.other", "ray.tune", 4),
        ("pkg.top", "pkg.sub.other", 1),
        ("pkg.top", "pkg.sub", 1),
    }


def test_checker_finds_an_upward_import_between_inner_layers(tmp_path):
    _write_tree(
        tmp_path,
        {
            "pkg/__init__.py": '_EXPORTS = {"run": "pkg.high.run"}\n',
            "pkg/base.py": "",
            "pkg/low/__init__.py": "",
            "pkg/low/a.py": "import pkg.base\ndef f():\n    # lazy, still counted\n    from pkg.high import run\n",
            "pkg/high/__init__.py": "",
            "pkg/high/run.py": "from pkg.low import a\nimport pkg.base\n",
        },
    )
    graph = collect(tmp_path, ("pkg",))
    upward = upward_imports(graph, (("pkg.low",), ("pkg.high",)), "pkg")
    assert [str(imp) for imp in upward] == [
        "pkg/low/a.py:4: pkg.low.a imports pkg.high.run",
        "pkg/low/a.py:4: pkg.low.a imports pkg.high",
    ]
