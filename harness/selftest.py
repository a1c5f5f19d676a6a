"""`python -m harness selftest`: the harness's detection power, proven on itself.

Every defect of the catalog (harness/selftest_catalog.py) runs through exactly the path a
third-party target takes (its Target, harness.runner.run, every check, the diagnosis) on the
CI-tier cases where it can show: those its `shows` names, minus the ill-posed ones (bf16 with
rank-deficient gradients, judged for finiteness only) and, single-process, those where the defect
leaves the mathematics alone (its fp64 updates within SHOWS of ours), at most CASES_PER_DEFECT,
half of them with bf16 compute where there are such. The correct targets (ours, and torch on
the cases it supports) run on every chosen case. Reported:

  kill rate    per defect: cases flagged (some check fails or errors) / cases where it can show,
               over all chosen cases and over the bf16-compute ones
  diagnosis    per defect: flagged cases whose diagnosis carries the defect's expected label
  false alarms failing checks of the correct targets

Exit status 1 on any surviving defect (a case where it shows and nothing fails) or any false
alarm; 0 otherwise.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from typing import TextIO

import torch

from cases import Case, ci_cases
from harness import checks, diagnosis, tolerance
from harness.inputs import make_inputs
from harness.runner import run
from harness.selftest_catalog import CATALOG, Defect, spec
from harness.targets import load_target
from harness.targets.base import Target
from reports import Record

CASES_PER_DEFECT = 6
CORRECT = ("ours", "torch")


@dataclass(frozen=True)
class Verdict:
    """One defect on one case."""

    case: Case
    killed: bool
    diagnosis: str
    expected: str

    @property
    def bf16(self) -> bool:
        return self.case.compute_dtype == "bf16"

    @property
    def diagnosed(self) -> bool:
        return self.killed and diagnosis.label(self.diagnosis) == self.expected


@dataclass(frozen=True)
class Outcome:
    verdicts: dict[str, list[Verdict]]
    false_alarms: dict[str, list[Record]]
    seconds: float

    @property
    def survivors(self) -> list[tuple[str, Case]]:
        return [(name, v.case) for name, vs in self.verdicts.items() for v in vs if not v.killed]

    @property
    def passed(self) -> bool:
        return not self.survivors and not any(self.false_alarms.values())


SHOWS = 1e-6
"""A defect shows in a case when, run in fp64, its updates differ from ours by more than this
(relative, worst step): the defect changes the mathematics there, not only the rounding."""


def effect(target: Target, ours: Target, case: Case) -> float:
    """Worst relative difference of the defect's updates from ours, both run in fp64 on `case`."""
    exact = dataclasses.replace(case, param_dtype="fp64", compute_dtype="fp64")
    inputs = make_inputs(exact)
    a = target.run(inputs.params, inputs.grads, exact)
    b = ours.run(inputs.params, inputs.grads, exact)
    worst = 0.0
    for i, p0 in enumerate(inputs.params):
        prev = p0.double()
        for k in range(exact.steps):
            da, db = a[k][i].double() - prev, b[k][i].double() - prev
            scale = float(db.norm())
            diff = float((da - db).norm())
            worst = max(worst, diff / scale if scale else (math.inf if diff else 0.0))
            prev = b[k][i].double()
    return worst


def can_show(defect: Defect, target: Target, ours: Target, case: Case) -> bool:
    """`defect.shows(case)`, the case is not ill-posed (bf16 with rank-deficient gradients: judged
    for finiteness only), and (single-process) the defect changes the fp64 updates by > SHOWS."""
    if not defect.shows(case):
        return False
    try:
        if checks.policy(case, ours, make_inputs(case)).ill_posed():
            return False
    except tolerance.NoEntry:  # a harness gap: the defect cannot be judged there
        return False
    return case.layout != "single" or effect(target, ours, case) > SHOWS


def choose(defect: Defect, target: Target, ours: Target, tier: list[Case], limit: int = CASES_PER_DEFECT) -> list[Case]:
    """Up to `limit` CI cases where `defect` can show, up to half of them with bf16 compute, in
    tier order (deterministic)."""
    shown = [c for c in tier if defect.shows(c) and (c.layout != "single") == defect.distributed]
    chosen: list[Case] = []
    for pool, cap in (([c for c in shown if c.compute_dtype == "bf16"], limit // 2),
                      ([c for c in shown if c.compute_dtype != "bf16"], limit)):
        for c in pool:
            if len(chosen) >= cap:
                break
            if can_show(defect, target, ours, c):
                chosen.append(c)
    return chosen


def _by_case(records: list[Record]) -> dict[str, list[Record]]:
    out: dict[str, list[Record]] = {}
    for r in records:
        out.setdefault(r.case_id, []).append(r)
    return out


def _run_all(cases: list[Case], target: Target, target_spec: str) -> list[Record]:
    single = [c for c in cases if c.layout == "single"]
    multi = [c for c in cases if c.layout != "single"]
    return (run(single, target, target_spec, "cpu", progress=None)
            + (run(multi, target, target_spec, "gloo", progress=None) if multi else []))


def selftest(limit: int = CASES_PER_DEFECT, defects: tuple[Defect, ...] = CATALOG) -> Outcome:
    """Run every defect and the correct targets; see the module docstring."""
    start = time.perf_counter()
    torch.set_num_threads(1)
    tier = ci_cases()
    ours = load_target("ours")
    verdicts: dict[str, list[Verdict]] = {}
    union: dict[str, Case] = {}
    for defect in defects:
        target = defect.make()
        cases = choose(defect, target, ours, tier, limit)
        union.update({c.id: c for c in cases})
        got = _by_case(_run_all(cases, target, spec(defect)))
        verdicts[defect.name] = []
        for c in cases:
            records = got.get(c.id, [])
            failing = [r for r in records if r.failing]
            verdicts[defect.name].append(Verdict(c, bool(failing), failing[0].diagnosis if failing else "",
                                                 defect.expected))
    false_alarms = {}
    for name in CORRECT:
        records = _run_all(list(union.values()), load_target(name), name)
        false_alarms[name] = [r for r in records if r.failing]
    return Outcome(verdicts, false_alarms, time.perf_counter() - start)


def _rate(part: int, whole: int) -> str:
    return f"{part}/{whole}" if whole else "-"


def render(outcome: Outcome) -> str:
    """The report the CLI prints: one line per defect, then the totals."""
    lines = [f"{'defect':28} {'expected diagnosis':19} {'killed':>7} {'bf16':>6} {'diagnosed':>9}"]
    totals = dict.fromkeys(("shown", "killed", "bf16", "bf16_killed", "diagnosed"), 0)
    for name, vs in outcome.verdicts.items():
        killed = sum(v.killed for v in vs)
        bf16 = [v for v in vs if v.bf16]
        diagnosed = sum(v.diagnosed for v in vs)
        expected = vs[0].expected if vs else ""
        lines.append(f"{name:28} {expected:19} {_rate(killed, len(vs)):>7} "
                     f"{_rate(sum(v.killed for v in bf16), len(bf16)):>6} {_rate(diagnosed, killed):>9}")
        for key, value in (("shown", len(vs)), ("killed", killed), ("bf16", len(bf16)),
                           ("bf16_killed", sum(v.killed for v in bf16)), ("diagnosed", diagnosed)):
            totals[key] += value
    lines.append(f"kill rate: {_rate(totals['killed'], totals['shown'])} cases over {len(outcome.verdicts)} defects; "
                 f"bf16 compute only: {_rate(totals['bf16_killed'], totals['bf16'])}; "
                 f"diagnosis right: {_rate(totals['diagnosed'], totals['killed'])}")
    for name, case in outcome.survivors:
        lines.append(f"SURVIVED {name}: {case.id}")
    for name, records in outcome.false_alarms.items():
        lines.append(f"false alarms on {name}: {len(records)}")
        lines.extend(f"  FALSE ALARM {r.check} {r.case_id} ratio {r.ratio:.3g}" for r in records)
    lines.append(f"selftest {'PASSED' if outcome.passed else 'FAILED'} in {outcome.seconds:.1f}s")
    return "\n".join(lines)


def main(limit: int = CASES_PER_DEFECT, stream: TextIO = sys.stdout) -> int:
    outcome = selftest(limit)
    print(render(outcome), file=stream)
    return 0 if outcome.passed else 1
