"""The selftest in CI, one test per catalog defect and compute class so that `pytest -n auto`
spreads them: on its quick tier (the first case where it can show with bf16 compute, and the first
without, from the CI tier and then the selftest's own long cases, harness.selftest.DRIFT_CASES:
harness.selftest.candidates), every defect is killed with the right diagnosis,
and the correct targets (ours, torch) raise no false alarm on those cases.

A defect that survives on its quick tier is listed in SURVIVES with the measured reason; its test
is a strict xfail, so it fails the moment the defect is caught (and the entry must go). None does:
the cases where a defect is hidden by bf16 noise on every check (its effect within each check's
allowance plus a correct run's value there) are not cases where it can show."""

import functools

import pytest

from harness import selftest
from harness.selftest_catalog import BY_NAME, CATALOG
from harness.targets import load_target

SURVIVES: dict[tuple[str, str], str] = {}
"""(defect, "bf16" | "fp") -> why it survives its quick case (an open detection gap, printed by
`python -m harness selftest` as a SURVIVED line); a case where a defect is hidden by noise is not
its quick case (harness.selftest.hidden_by_noise), so an entry here is a gap of the checks."""


@functools.cache
def _tier():
    return selftest.selftest_tier()


def _params():
    for d in CATALOG:
        for kind in ("bf16", "fp"):
            reason = SURVIVES.get((d.name, kind))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            yield pytest.param(d.name, kind, marks=marks, id=f"{d.name}-{kind}")


@pytest.mark.parametrize("name, kind", list(_params()))
def test_defect_is_killed_and_diagnosed_without_false_alarms(name, kind):
    defect = BY_NAME[name]
    cases = selftest.candidates(defect, defect.make(), load_target("ours"), _tier(), kind == "bf16", 1)
    if not cases:
        pytest.skip(f"{name} can show in no CI case with {'bf16' if kind == 'bf16' else 'fp32/fp64'} compute")
    verdicts = selftest.judge(defect, cases)
    assert all(v.killed for v in verdicts), [v.case.id for v in verdicts if not v.killed]
    assert all(v.explained for v in verdicts), [(v.case.id, v.diagnosis) for v in verdicts]
    alarms = selftest.false_alarms(cases)
    assert not any(alarms.values()), {k: [(r.check, r.case_id) for r in v] for k, v in alarms.items()}


def test_every_defect_can_show_in_the_ci_tier():
    ours = load_target("ours")
    nowhere = [d.name for d in CATALOG
               if not any(selftest.candidates(d, d.make(), ours, _tier(), bf16, 1) for bf16 in (True, False))]
    assert not nowhere
