"""Counting the cases a wrong target fails, stopping once there are enough to make the point."""

from __future__ import annotations

from collections.abc import Iterable

from cases import Case
from harness.runner import run_case
from harness.targets import load_target


def failed_cases(cases: Iterable[Case], spec: str, enough: int) -> tuple[int, int]:
    """(failed, run): the cases run in order through target `spec` until `enough` have a failing check."""
    target = load_target(spec)
    failed = run = 0
    for case in cases:
        run += 1
        failed += any(r.failing for r in run_case(case, target, spec))
        if failed == enough:
            break
    return failed, run
