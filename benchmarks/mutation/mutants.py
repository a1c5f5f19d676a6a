"""Mutants of a module: cosmic-ray's operators (its standard set, the one `cosmic-ray init` uses
without operator arguments) applied one occurrence at a time, each mutant named by what it changes.

A mutant's `signature` is (module, the original lines it changes, the lines it puts there): stable
across edits elsewhere in the file, so the reviewed list of equivalent mutants (equivalent.toml)
keeps naming the same mutants after unrelated changes.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
from dataclasses import dataclass
from pathlib import Path

import cosmic_ray.plugins
from cosmic_ray.ast import ast_nodes, get_ast
from cosmic_ray.mutating import mutate_code


@dataclass(frozen=True)
class Mutant:
    """One occurrence of one operator in one module (a path relative to the project root)."""

    module: str
    operator: str
    occurrence: int
    line: int
    """First line the mutation touches (1-based)."""
    before: str
    """The original lines it changes, stripped, joined by newlines."""
    after: str
    """The lines it puts there, stripped, joined by newlines."""

    @property
    def key(self) -> str:
        """A name for this mutant in a session: module, operator and occurrence."""
        return f"{self.module}:{self.operator}:{self.occurrence}"

    @property
    def signature(self) -> tuple[str, str, str]:
        return (self.module, self.before, self.after)

    def source(self, original: str) -> str:
        """The module's source with this mutation applied."""
        mutated = mutate_code(original, _operator(self.operator), self.occurrence)
        if mutated is None:
            raise ValueError(f"{self.key}: no such occurrence in this source of {self.module}")
        return mutated


def _operator(name: str):
    return cosmic_ray.plugins.get_operator(name)()


def operator_names() -> list[str]:
    """cosmic-ray's operators that take no arguments (those `cosmic-ray init` runs by default)."""
    return [n for n in cosmic_ray.plugins.operator_names() if not cosmic_ray.plugins.get_operator(n).arguments()]


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def changed_lines(original: str, mutated: str) -> tuple[int, str, str]:
    """(first changed line that is not blank, 1-based; original lines changed; lines put there), both stripped.
    Not blank: a removed decorator's change starts at the blank lines above it, which no judge executes."""
    a, b = original.split("\n"), mutated.split("\n")
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            first = next((k for k in range(i1, i2) if a[k].strip()), i1)
            return (first + 1, "\n".join(s.strip() for s in a[i1:i2]), "\n".join(s.strip() for s in b[j1:j2]))
    raise ValueError("the mutation changed nothing")


class _Unannotated(ast.NodeTransformer):
    """A syntax tree without its annotations (arguments', returns', annotated assignments')."""

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.returns = None
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AnnAssign:
        node.annotation = ast.Constant(None)
        return self.generic_visit(node)


def _code(source: str) -> str:
    return ast.dump(_Unannotated().visit(ast.parse(source)))


def annotation_only(original: str, mutated: str) -> bool:
    """True when `mutated` differs from `original` only in annotations and the module postpones them (`from
    __future__ import annotations`: they are strings nothing evaluates), so no input can tell them apart."""
    postponed = any(isinstance(node, ast.ImportFrom) and node.module == "__future__"
                    and any(a.name == "annotations" for a in node.names) for node in ast.parse(original).body)
    if not postponed:
        return False
    try:
        return _code(original) == _code(mutated)
    except SyntaxError:  # cosmic-ray can write invalid code (`**mapping` to `+mapping`): it fails at import
        return False


def mutants(module: str, root: Path) -> list[Mutant]:
    """Every mutant of `module` (a path relative to `root`), in operator then occurrence order; a
    mutation whose code equals the original (cosmic-ray can produce such), or that changes only postponed
    annotations (`annotation_only`), is left out."""
    original = (root / module).read_text()
    tree = get_ast(original)
    out = []
    for name in operator_names():
        operator = _operator(name)
        count = sum(1 for node in ast_nodes(tree) for _ in operator.mutation_positions(node))
        for occurrence in range(count):
            mutated = mutate_code(original, operator, occurrence)
            if mutated is None or mutated == original or annotation_only(original, mutated):
                continue
            line, before, after = changed_lines(original, mutated)
            out.append(Mutant(module, name, occurrence, line, before, after))
    return out
