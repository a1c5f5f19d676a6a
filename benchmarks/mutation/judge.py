"""The judging of one mutant, in a process forked from the driver with the mutated copy of the
project first on its path: the plan's lead tests (its likeliest killers), its cases (the harness's
checks against the FP64 oracles, on our optimizer), then its gloo cases, then its unit tests,
stopping at the first that fails.

The verdict is "killed" (with what killed it: a failing or erroring check of a case, a failing
test, or the mutated code failing to import) or "survived".
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path

from benchmarks.mutation.selection import Plan


def _failing_case(case_ids: list[str], backend: str) -> str | None:
    from cases import Case
    from harness.runner import run_case
    from harness.targets import load_target

    ours = load_target("ours")
    for case_id in case_ids:
        for record in run_case(Case.from_id(case_id), ours, "ours", backend):
            if record.failing:
                return f"{backend} case {case_id}: {record.check} {record.status}"
    return None


def _failing_tests(node_ids: list[str]) -> str | None:
    import pytest

    failed: list[str] = []

    class Failures:
        def pytest_runtest_logreport(self, report):
            if report.failed:
                failed.append(report.nodeid)

        def pytest_collectreport(self, report):
            if report.failed:
                failed.append(f"collecting {report.nodeid}")

    code = pytest.main([*node_ids, "-x", "-q", "-p", "no:cacheprovider"], plugins=[Failures()])
    if code in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) and not failed:
        return None
    return "test " + (failed[0] if failed else f"run exited {int(code)}")


def verdict(p: Plan) -> tuple[str, str]:
    """("killed", by what) or ("survived", "") for the code importable in this process."""
    import torch

    torch.set_num_threads(1)
    try:
        import harness.runner  # noqa: F401 (the mutated code must import)
        import optimizers  # noqa: F401
        import oracles  # noqa: F401
    except Exception as exc:  # a mutant that breaks the import is killed by every judge
        return "killed", f"import: {type(exc).__name__}: {exc}"
    for judges, run_them in ((p.lead, lambda: _failing_tests(p.lead)),
                             (p.cases, lambda: _failing_case(p.cases, "cpu")),
                             (p.gloo, lambda: _failing_case(p.gloo, "gloo")),
                             (p.tests, lambda: _failing_tests(p.tests))):
        found = run_them() if judges else None
        if found:
            return "killed", found
    return "survived", ""


def run(p: Plan, out: Path) -> int:
    """The child's body: write the verdict to `out` as JSON; an exception is a kill, its traceback kept
    in the log. Returns the child's exit status (0)."""
    try:
        status, by = verdict(p)
    except Exception as exc:
        traceback.print_exc()
        status, by = "killed", f"exception: {type(exc).__name__}: {exc}"
    out.write_text(json.dumps({"status": status, "by": by}))
    return 0
