"""Which judges reach which line: the coverage map a session selects each mutant's judges from.

Measured once per state of the project's sources, in a process of its own on an unmutated copy:
every single-process case of our own CI tier run against our optimizer (`harness.runner.run_case`),
then the unit-test files asked for (pytest in the same process), each case and each test under a
coverage context of its own. A line's judges are the cases and tests whose context executed it,
with the seconds each took (the map orders them cheapest first). Code that runs only in other
processes (the gloo ranks, a test's subprocess) is not in the map; `plan` gives such lines gloo cases.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

SOURCES = ("optimizers", "oracles", "cases", "harness", "reports")
"""The packages whose contents decide what the map measures (its key, with the test files it runs)."""


def project_key(root: Path, test_files: list[str], select: list[str]) -> str:
    """A hash of every source the map depends on (the packages, conftest.py and the test files it runs)
    and of the case selection."""
    h = hashlib.sha256("\n".join(select).encode())
    paths = [p for package in SOURCES for p in sorted((root / package).rglob("*"))
             if p.is_file() and p.suffix in (".py", ".json") and "__pycache__" not in p.parts]
    for path in paths + [root / "conftest.py"] + [root / f for f in sorted(test_files)]:
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Reach:
    """The coverage map: for each module and line, the cases and tests that execute it."""

    key: str
    case_seconds: dict[str, float]
    test_seconds: dict[str, float]
    lines: dict[str, dict[int, tuple[list[str], list[str]]]]
    """module -> line -> (case ids, test node ids)."""
    gloo_cases: list[str]
    """The CI tier's distributed cases, in tier order (the map does not run them)."""
    broken: list[str]
    """Cases and tests that fail on the unmutated code: never a judge (they would kill every mutant)."""

    def cases(self, module: str, line: int) -> list[str]:
        return [c for c in self.lines.get(module, {}).get(line, ([], []))[0] if c not in self.broken]

    def tests(self, module: str, line: int) -> list[str]:
        return [t for t in self.lines.get(module, {}).get(line, ([], []))[1] if t not in self.broken]

    def save(self, path: Path) -> None:
        cases = sorted(self.case_seconds)
        tests = sorted(self.test_seconds)
        ci, ti = {c: i for i, c in enumerate(cases)}, {t: i for i, t in enumerate(tests)}
        lines = {m: {str(n): [[ci[c] for c in cs], [ti[t] for t in ts]] for n, (cs, ts) in by_line.items()}
                 for m, by_line in self.lines.items()}
        path.write_text(json.dumps({"key": self.key, "cases": cases, "tests": tests,
                                    "case_seconds": [self.case_seconds[c] for c in cases],
                                    "test_seconds": [self.test_seconds[t] for t in tests], "lines": lines,
                                    "gloo_cases": self.gloo_cases, "broken": self.broken}))

    @classmethod
    def load(cls, path: Path) -> "Reach":
        raw = json.loads(path.read_text())
        cases, tests = raw["cases"], raw["tests"]
        lines = {m: {int(n): ([cases[i] for i in cs], [tests[i] for i in ts]) for n, (cs, ts) in by_line.items()}
                 for m, by_line in raw["lines"].items()}
        return cls(raw["key"], dict(zip(cases, raw["case_seconds"])), dict(zip(tests, raw["test_seconds"])), lines,
                   raw["gloo_cases"], raw["broken"])


def measure(root: Path, modules: list[str], test_files: list[str], select: list[str], key: str) -> Reach:
    """Run our own CI tier's single-process cases (the global tier's, then the rows built from our documented
    defaults; those whose id contains a string of `select`, all when it
    is empty) and `test_files` under coverage (in this process, whose imports must come from `root`) and
    return the map of `modules` (paths relative to `root`)."""
    import coverage
    import pytest
    import torch

    cov = coverage.Coverage(data_file=None, include=[str(root / m) for m in modules], config_file=False)
    case_seconds: dict[str, float] = {}
    test_seconds: dict[str, float] = {}
    broken: list[str] = []
    gloo_cases: list[str] = []
    cov.start()
    try:
        from harness.runner import run_case
        from harness.running.selection import target_tier
        from harness.targets import load_target

        torch.set_num_threads(1)
        ours = load_target("ours")
        for case in target_tier("ci", ours).cases:
            if select and not any(s in case.id for s in select):
                continue
            if case.layout != "single":
                gloo_cases.append(case.id)
                continue
            cov.switch_context("case:" + case.id)
            start = time.perf_counter()
            if any(r.failing for r in run_case(case, ours, "ours", "cpu")):
                broken.append(case.id)
            case_seconds[case.id] = time.perf_counter() - start
        if test_files:
            pytest.main([*test_files, "-q", "-p", "no:cacheprovider"],
                        plugins=[_TestContexts(cov, test_seconds, broken)])
    finally:
        cov.switch_context("")
        cov.stop()
    data = cov.get_data()
    lines: dict[str, dict[int, tuple[list[str], list[str]]]] = {}
    for module in modules:
        by_line = data.contexts_by_lineno(str(root / module))
        lines[module] = {n: (sorted(c[5:] for c in ctxs if c.startswith("case:")),
                             sorted(c[5:] for c in ctxs if c.startswith("test:")))
                         for n, ctxs in by_line.items()}
    return Reach(key, case_seconds, test_seconds, lines, gloo_cases, broken)


class _TestContexts:
    """A pytest plugin: each test runs under the coverage context `test:<node id>`; its seconds kept,
    and a failing one listed in `broken`."""

    def __init__(self, cov, seconds: dict[str, float], broken: list[str]) -> None:
        self.cov, self.seconds, self.broken = cov, seconds, broken

    def pytest_runtest_logreport(self, report):
        if report.failed and report.nodeid not in self.broken:
            self.broken.append(report.nodeid)

    def pytest_runtest_protocol(self, item, nextitem):  # noqa: ARG002 (pytest's hook signature)
        self.cov.switch_context("test:" + item.nodeid)
        self._start = time.perf_counter()

    def pytest_runtest_logfinish(self, nodeid, location):  # noqa: ARG002
        self.seconds[nodeid] = time.perf_counter() - self._start
        self.cov.switch_context("")
