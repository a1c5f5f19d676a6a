"""The project's structure, measured from its code: no import cycle, and each algorithm at home.

Import cycles: every module-level import between the project's modules (`import x`, `from x import y`,
`from x import submodule`), as written; a cycle of any length fails, naming its modules.

Homes: adding an algorithm is four files — its optimizer record (optimizers/algorithms/), its oracle
(oracles/), its harness record (harness/algorithms/) and its case entry (cases/algorithms/); every registry
discovers them. So no other library module names an algorithm in its code (identifiers and string
literals; docstrings and comments may). Adapters of particular implementations (harness/targets/) and the
selftest's catalog of defects name the algorithms they implement or break, and are not counted.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("optimizers", "oracles", "cases", "harness", "reports")


def modules() -> dict[str, Path]:
    """Every module of the project's packages, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports at module level: `from package import submodule` imports the
    submodule (the package is already initialising), `from module import name` the module."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            submodules = {f"{base}.{a.name}" for a in node.names} & known.keys()
            out.update(submodules)
            if len(submodules) < len(node.names):  # a name defined in `base` itself
                out.add(base)
    return {m for m in out if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_no_module_imports_itself_back():
    found = cycles(import_graph())
    assert not found, f"import cycles: {found}"


def test_the_cycle_finder_finds_a_cycle():
    """Negative control: a three-module loop and a self-contained pair are found; a chain is not."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def code_names(path: Path) -> set[str]:
    """Identifiers and string literals of a module's code, docstrings (any string standing alone as a
    statement, the attribute docstrings after a constant too) left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.update(node.name.split("."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.add(node.value)
    return out


HOMES = {
    "normuon": {"optimizers/algorithms/normuon.py", "oracles/normuon_reference.py", "harness/algorithms/normuon.py",
                "cases/algorithms/normuon.py"},
    "dion2": {"optimizers/algorithms/dion2.py", "oracles/dion2_reference.py", "harness/algorithms/dion2.py",
              "cases/algorithms/dion2.py"},
    "nordion2": {"optimizers/algorithms/dion2.py", "oracles/dion2_reference.py", "harness/algorithms/nordion2.py",
                 "cases/algorithms/nordion2.py"},
}
"""Each algorithm's four homes (NorDion2's optimizer record and oracle live beside Dion2's)."""


NOT_COUNTED = ("harness/targets/", "harness/apps/selftest", "optimizers/__init__.py", "oracles/__init__.py",
               "oracles/conventions.py")
"""Modules that name algorithms by their nature, none of which a new algorithm needs to edit: adapters of
particular implementations, the selftest's defects and hand-picked cases, the packages' public re-exports
(a new algorithm is reached by name, `Muon(params, algorithm=...)`), and the vocabulary of conventions
that differ between implementations (some of them one algorithm's)."""


def naming(algorithm: str) -> set[str]:
    """The library modules whose code names `algorithm` (as a word of an identifier or a string), other
    algorithms' homes left out (an algorithm's home names those it builds on)."""
    word = re.compile(rf"(?<![a-z0-9]){algorithm}(?![a-z0-9])", re.IGNORECASE)
    others = set().union(*(h for name, h in HOMES.items() if name != algorithm))
    out = set()
    for path in modules().values():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(NOT_COUNTED) or rel in others:
            continue
        if any(word.search(name) for name in code_names(path)):
            out.add(rel)
    return out


@pytest.mark.parametrize("algorithm", sorted(HOMES))
def test_an_algorithm_is_named_only_in_its_four_homes(algorithm):
    outside = naming(algorithm) - HOMES[algorithm]
    assert not outside, f"{algorithm} is named in the code of {sorted(outside)}, beyond its four homes"
    assert len(HOMES[algorithm]) == 4


def test_the_home_count_sees_a_name_in_code_not_in_docstrings(tmp_path, monkeypatch):
    """Negative control: a module that names an algorithm in a string literal is counted; one that names it
    only in its docstring is not."""
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "a.py").write_text('"""About dion2."""\nX = 1\n"""dion2 again."""\n')
    (tmp_path / "harness" / "b.py").write_text('MODE = "dion2"\n')
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert naming("dion2") == {"harness/b.py"}
