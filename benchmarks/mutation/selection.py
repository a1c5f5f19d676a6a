"""Each mutant's judges, chosen from the coverage map (reach.py).

- numerical code: the single-process CI cases that execute the mutated line, cheapest first, at
  most `max_cases`;
- optimizer code that no single-process case and no unit test executes in-process (distributed
  paths), and, after their single-process cases, lines that name distributed things (DISTRIBUTED): the gloo
  cases of the CI tier for the module's algorithms (ALGORITHMS; every algorithm for shared code), spread over
  the tier, at most `max_gloo`; for code no single-process judge runs, also the rank pools' tests of its
  algorithms (tests/test_distributed_normuon.py for normuon.py; every tests/test_distributed_*.py for shared
  code: plan.py's `continue` after an exchange made `break` passed its gloo cases, each of one megabatch,
  and fails the FSDP2 step of four shapes in test_distributed_muon.py), first however slow (dion2.py's
  local-scope labels survived while its 40 cheapest named tests were all single-process ones), then the
  tests of the files named for the module; the ranks run in processes the map does not see;
- oracle code that no single-process case runs, in an oracle only distributed cases call
  (DISTRIBUTED_ORACLES: the TP reference): the gloo cases of its placements, then its unit tests;
- validation, state and checkpoint code: the unit tests that execute the line, cheapest first, at
  most `max_tests` (the checkpoint checks are such tests), the module's own test files' among them first
  (`own_test_prefixes`, those named for the module or its packages: the cheapest tests of a line every step
  runs are other modules' tests, and the expensive one written for it, such as a large matrix's norm, would
  never be chosen), then the tests named for the line's rarest identifiers (`naming`: a line every case runs
  can mutate a branch only some reach, such as matrix_view.py's `shape[0] // self.num_heads`, whose 40
  cheapest tests held no test of num_heads);
- code that runs when the module is imported (its constants, default tables and declarations,
  `import_lines`: the map sees it run under no case or test, or a table's later lines not at all): every
  case that executes any line of the module, cheapest first, and its `max_tests` tests: first those that build
  each optimizer with no option or lr only (DEFAULTS_TESTS: the defaults cases pass the lr and build through
  Muon(algorithm=...), so Dion2's own default lr of 0.01 mutated to 1.01 passed 105 cases and 40 of its own
  tests), then the module's own test files' and the rest as above.

A line nothing executes gets no judge at all, and its mutants survive as unreached.
"""

from __future__ import annotations

import ast
import builtins
import collections
import functools
import keyword
import re
from dataclasses import dataclass, field

from benchmarks.mutation.reach import Reach

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "optimizers/algorithms/muon.py": ("muon",),
    "optimizers/algorithms/normuon.py": ("normuon",),
    "optimizers/algorithms/dion2.py": ("dion2", "nordion2"),
}
"""The algorithms (first part of a case id, before any '-') whose gloo cases judge a module; a module
not named here is shared by every algorithm."""


DISTRIBUTED = re.compile(r"process_group|placement|DTensor|mesh|layout|rank|shard|world", re.IGNORECASE)
"""Names on an optimizer line that single-process judges execute but whose branch only ranks take: such a line is
judged by gloo cases too (plan.py's `process_group is not None and uses_mesh_layout(...)` mutated to `is None`
passed 40 single-process cases and 173 tests, and failed a tensor-parallel gloo case at ratio 1.3e13)."""


DISTRIBUTED_ORACLES: dict[str, str] = {"oracles/tensor_parallel.py": "tp"}
"""Oracles that only distributed cases call, and the placements (a substring) of those cases: their lines no
single-process case runs are judged by these gloo cases too (the harness computes their reference in its own
process). The TP oracle's rounding and head checks had passed their 5 to 15 unit tests 29 ways."""


DEFAULTS_TESTS = ("tests/test_defaults.py::test_defaults_step_as_documented",)
"""The tests that build each optimizer class as most users do, against its documented defaults."""


@dataclass(frozen=True)
class Plan:
    """The judges of one mutant, run in this order until one fails: `lead` (tests that killed mutants of
    its line before: `killers_first`), `cases`, `gloo`, `tests`."""

    cases: list[str] = field(default_factory=list)
    gloo: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)
    lead: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.lead or self.cases or self.gloo or self.tests)


def algorithm_of(case_id: str) -> str:
    return case_id.split("/", 1)[0].split("-", 1)[0]


def spread(items: list[str], limit: int) -> list[str]:
    """At most `limit` of the distributed case ids `items` (deterministic): the first case of each layout
    (`layout_of`), then the second of each, and so on. Layouts in the order: the first layout of each placement,
    the placements most cases have first (with fewer picks than placements, the common exchanges: plan.py's
    tensor-parallel guard made `or` fails every replicated case, and evenly spaced layouts of the CI tier's
    nine placements had picked none), then the other layouts (another scope of a placement), in the same order.
    Layouts before repeats: a branch that only one layout runs (Dion2's local-scope labels under Shard(1)) is
    more often judged by a case of it."""
    if len(items) <= limit:
        return list(items)
    groups: dict[tuple[str, str], list[str]] = {}
    for item in items:
        groups.setdefault(layout_of(item), []).append(item)
    count: collections.Counter[str] = collections.Counter()
    first: dict[str, tuple[str, str]] = {}  # placement -> its first layout
    for key, members in groups.items():
        count[key[1]] += len(members)
        first.setdefault(key[1], key)
    rounds = [groups[key] for key in sorted(groups, key=lambda key: (first[key[1]] != key, -count[key[1]]))]
    out: list[str] = []
    for i in range(max(len(r) for r in rounds)):
        out += [r[i] for r in rounds if i < len(r)]
    return out[:limit]


def layout_of(case_id: str) -> tuple[str, str]:
    """A distributed case's layout: its selection scope (the first part's last token, where it names one) and its
    placement (the part before the world size: shard0, shard1, replicated, ...)."""
    parts = case_id.split("/")
    scope = parts[0].rsplit("-", 1)[-1] if parts[0].endswith(("-local", "-global")) else ""
    return scope, parts[-2] if len(parts) > 1 else ""


@functools.cache
def import_lines(source: str) -> frozenset[int]:
    """The lines of `source` that run when it is imported: every line of its module-level statements and of
    its class bodies, but not of function bodies. Coverage records a statement by its first line, so a
    constant table's later lines are in no map."""
    lines: set[int] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                lines.update(range(node.lineno, node.body[0].lineno))  # its header: bases, keywords
                lines.update(d.lineno for d in node.decorator_list)
                visit(node.body)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines.update(range(node.lineno, node.body[0].lineno))  # its signature: defaults, decorators
                lines.update(d.lineno for d in node.decorator_list)
            else:
                lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    visit(ast.parse(source).body)
    return frozenset(lines)


IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")
"""A name of four characters or more: what a test's name can be named for."""

UNNAMED = frozenset(w.lower() for w in [*keyword.kwlist, *dir(builtins), "self", "torch"])
"""Identifiers no test is named for."""


def naming(text: str, tests: list[str]) -> dict[str, float]:
    """Per test, how much its name (lower case) is named for the identifiers of `text` (a mutated line): each
    identifier it holds counts 1 / the number of `tests` holding it, so the rarest weigh most; 0 for none."""
    names = {t: t.lower() for t in tests}
    score = dict.fromkeys(tests, 0.0)
    for word in {w.lower() for w in IDENTIFIER.findall(text)} - UNNAMED:
        holding = [t for t, name in names.items() if word in name]
        for t in holding:
            score[t] += 1.0 / len(holding)
    return score


def own_test_prefixes(module: str) -> tuple[str, ...]:
    """The node-id prefixes of a module's own tests: the test files named for it (tests/test_<stem>.py and
    tests/test_<stem>_*.py), then those named for each package that holds it
    (optimizers/algorithms/base.py's frozen records are tested in tests/test_algorithms.py, the oracles in
    tests/test_oracles*.py)."""
    names = module.removesuffix(".py").split("/")[::-1]
    return tuple(p for name in names for p in (f"tests/test_{name}.py::", f"tests/test_{name}_"))


def plan(reach: Reach, module: str, line: int, gloo_cases: list[str], max_cases: int, max_gloo: int,
         max_tests: int, imported: frozenset[int] = frozenset(), text: str = "") -> Plan:
    """The judges of a mutant of `module` at `line` (see the module docstring); `gloo_cases` are the
    distributed case ids of the CI tier, in tier order; `imported`: the module's `import_lines`; `text`: the
    lines it mutates."""
    cases, tests = reach.cases(module, line), reach.tests(module, line)
    case_limit = max_cases
    ran_at_import = line in imported or line in reach.lines.get(module, {})
    first: tuple[str, ...] = ()
    stem = module.rsplit("/", 1)[-1].removesuffix(".py")
    own = own_test_prefixes(module)
    if not cases and not tests and ran_at_import:  # run at import, under no judge
        every = [n for n in reach.lines.get(module, {}) if n != line]
        cases = sorted({c for n in every for c in reach.cases(module, n)})
        # and the module's own tests, which may execute none of its lines (a frozen dataclass's generated
        # __setattr__ and __hash__: matrix_view.py's `frozen=False` passed 443 cases and 200 tests without them)
        tests = sorted({t for n in every for t in reach.tests(module, n)}
                       | {t for t in reach.test_seconds if t.startswith(own) and t not in reach.broken})
        case_limit = len(cases)
        first = DEFAULTS_TESTS
    cases = sorted(cases, key=lambda c: (reach.case_seconds[c], c))[:case_limit]
    score = naming(text, tests)
    tests = sorted(tests, key=lambda t: (not (first and t.startswith(first)), not t.startswith(own),
                                         -score[t], reach.test_seconds[t], t))
    tests = tests[:max_tests]
    gloo: list[str] = []
    unreached = not cases and not tests
    wanted = ALGORITHMS.get(module)
    if module.startswith("optimizers/") and (unreached or DISTRIBUTED.search(text)):
        gloo = spread([c for c in gloo_cases if wanted is None or algorithm_of(c) in wanted], max_gloo)
    elif module in DISTRIBUTED_ORACLES and not cases:
        gloo = spread([c for c in gloo_cases if DISTRIBUTED_ORACLES[module] in layout_of(c)[1]], max_gloo)
    if unreached and module.startswith("optimizers/"):  # the rank pools' tests, and those named for it
        pools = tuple(f"test_distributed_{a}" for a in wanted) if wanted else ("test_distributed_",)

        def file(t: str) -> str:
            return t.split("::")[0].rsplit("/", 1)[-1]
        named = [t for t in reach.test_seconds if (stem in file(t) or file(t).startswith(pools))
                 and t not in reach.broken]
        tests = sorted(named, key=lambda t: (not file(t).startswith(pools), reach.test_seconds[t], t))[:max_tests]
    return Plan(cases, gloo, tests)


KILLED_BY = re.compile(r"(?:cpu|gloo) case (?P<case>[^ :]+)|test (?P<test>.+?)(?: \(a survivor judged again\))?$")
"""The judge a killed verdict's `by` names: a case id ("cpu case ID: check status") or a test node id."""


def judge_of(by: str) -> str | None:
    """The case id or test node id that a killed verdict's `by` names; None for another cause (an import)."""
    found = KILLED_BY.match(by)
    return (found["case"] or found["test"]) if found else None


LEAD_TESTS = 3
"""How many tests that killed a mutant's line before run before its cases (`killers_first`)."""


def killers_first(p: Plan, line: list[str], others: list[str]) -> Plan:
    """`p` with the judges that killed mutants before moved to the front of their lists: `line`'s (those of
    the mutant's line), then `others` (of the rest of its module), each list the likeliest first; the first
    LEAD_TESTS tests among `line`'s moved to `lead`, run before the cases. The same judges in another order:
    a kill and a survival are the same, only reached sooner (spectral.py's 165 mutants of one line of the
    Gram path each took about 40 s to reach the test that killed them; a coefficient table's mutants ran
    every CI case, about 40 s, before the test that compares the tables). Only a line's own killers lead:
    a module's, ahead of the 2 s case that kills a line every case runs, cost 10 s a mutant."""
    killers = line + [j for j in others if j not in line]
    rank = {j: i for i, j in reversed(list(enumerate(killers)))}

    def ordered(judges: list[str]) -> list[str]:
        return sorted(judges, key=lambda j: rank.get(j, len(killers)))  # stable: the rest keep their order
    tests = ordered(p.tests)
    lead = [t for t in tests if t in line][:LEAD_TESTS]
    return Plan(ordered(p.cases), ordered(p.gloo), [t for t in tests if t not in lead], p.lead + lead)


def estimated_seconds(reach: Reach, p: Plan, gloo_seconds: float) -> float:
    """The plan's cost as measured by the map (a gloo case at `gloo_seconds`)."""
    return (sum(reach.case_seconds[c] for c in p.cases) + sum(reach.test_seconds[t] for t in p.lead + p.tests)
            + gloo_seconds * len(p.gloo))
