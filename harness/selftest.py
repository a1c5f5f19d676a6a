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
  diagnosis    per defect: flagged cases whose diagnosis carries the defect's expected label, and
               those where the catalog states why no diagnosis can single the defect out
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
from harness.runner import run, run_case
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
    reason: str | None = None
    """Why no diagnosis can single the defect out here (Defect.ambiguous), if so."""
    measured: str = ""
    """For a survivor, the measured sizes that set its effect against the noise (survivor_evidence)."""

    @property
    def bf16(self) -> bool:
        return self.case.compute_dtype == "bf16"

    @property
    def diagnosed(self) -> bool:
        return self.killed and diagnosis.label(self.diagnosis) == self.expected

    @property
    def explained(self) -> bool:
        """Killed, and diagnosed right or with a stated reason why no diagnosis can be."""
        return self.diagnosed or (self.killed and self.reason is not None)


@dataclass(frozen=True)
class Outcome:
    verdicts: dict[str, list[Verdict]]
    false_alarms: dict[str, list[Record]]
    seconds: float

    @property
    def survivors(self) -> list[tuple[str, Verdict]]:
        return [(name, v) for name, vs in self.verdicts.items() for v in vs if not v.killed]

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


def bitwise_ours(target: Target, ours: Target, case: Case) -> bool:
    """Whether the defect's trajectory on `case`, in the case's own dtypes, is bitwise ours: then no
    check of any harness can tell them apart (e.g. momentum rounded to bf16 for one step whose
    orthogonalization rounds its input to bf16 anyway)."""
    inputs = make_inputs(case)
    a = target.run(inputs.params, inputs.grads, case)
    b = ours.run(inputs.params, inputs.grads, case)
    return all(torch.equal(x, y) for sa, sb in zip(a, b) for x, y in zip(sa, sb))


def can_show(defect: Defect, target: Target, ours: Target, case: Case) -> bool:
    """`defect.shows(case)`, the case is not ill-posed (bf16 with rank-deficient gradients: judged
    for finiteness only), and (single-process) the defect changes the fp64 updates by > SHOWS and
    its trajectory in the case's own dtypes is not bitwise ours."""
    if not defect.shows(case):
        return False
    try:
        if checks.policy(case, ours, make_inputs(case)).ill_posed():
            return False
    except tolerance.NoEntry:  # a harness gap: the defect cannot be judged there
        return False
    return case.layout != "single" or (effect(target, ours, case) > SHOWS and not bitwise_ours(target, ours, case))


def candidates(defect: Defect, target: Target, ours: Target, tier: list[Case], bf16: bool, limit: int) -> list[Case]:
    """The first `limit` cases of `tier` (in order: deterministic) with bf16 compute or without, of
    the defect's kind (distributed or single-process), where it can show."""
    chosen: list[Case] = []
    for c in tier:
        if len(chosen) >= limit:
            break
        if ((c.compute_dtype == "bf16") == bf16 and (c.layout != "single") == defect.distributed
                and can_show(defect, target, ours, c)):
            chosen.append(c)
    return chosen


def choose(defect: Defect, target: Target, ours: Target, tier: list[Case], limit: int = CASES_PER_DEFECT) -> list[Case]:
    """Up to `limit` CI cases where `defect` can show, up to half of them with bf16 compute, in
    tier order (deterministic)."""
    bf16 = candidates(defect, target, ours, tier, True, limit // 2)
    return bf16 + candidates(defect, target, ours, tier, False, limit - len(bf16))


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


def survivor_evidence(target: Target, ours: Target, case: Case) -> str:
    """The measured argument printed beside a survivor: how far the defect moves the update in fp64
    (its effect) against how far ours' own run of the case is from the FP64 reference (the noise
    of a correct implementation in the case's dtypes)."""
    if case.layout != "single":
        return ""
    noise = [r.rel_err for r in run_case(case, ours, "ours") if r.check == "reference"]
    return (f"fp64 effect {effect(target, ours, case):.2g} of the update; ours' own reference error there "
            f"{noise[0]:.2g}" if noise else f"fp64 effect {effect(target, ours, case):.2g} of the update")


def judge(defect: Defect, cases: list[Case]) -> list[Verdict]:
    """The defect's verdict on each of `cases` (run through the runner, every check, the diagnosis);
    a survivor carries its measured evidence (survivor_evidence)."""
    target = defect.make()
    got = _by_case(_run_all(cases, target, spec(defect)))
    verdicts = []
    for c in cases:
        failing = [r for r in got.get(c.id, []) if r.failing]
        measured = "" if failing else survivor_evidence(target, load_target("ours"), c)
        verdicts.append(Verdict(c, bool(failing), failing[0].diagnosis if failing else "", defect.expected,
                                defect.ambiguous(c), measured))
    return verdicts


def false_alarms(cases: list[Case]) -> dict[str, list[Record]]:
    """Failing records of each correct target (CORRECT) on `cases`."""
    return {name: [r for r in _run_all(cases, load_target(name), name) if r.failing] for name in CORRECT}


def selftest(limit: int = CASES_PER_DEFECT, defects: tuple[Defect, ...] = CATALOG) -> Outcome:
    """Run every defect and the correct targets; see the module docstring."""
    start = time.perf_counter()
    torch.set_num_threads(1)
    tier = ci_cases()
    ours = load_target("ours")
    verdicts: dict[str, list[Verdict]] = {}
    union: dict[str, Case] = {}
    for defect in defects:
        cases = choose(defect, defect.make(), ours, tier, limit)
        union.update({c.id: c for c in cases})
        verdicts[defect.name] = judge(defect, cases)
    return Outcome(verdicts, false_alarms(list(union.values())), time.perf_counter() - start)


def _rate(part: int, whole: int) -> str:
    return f"{part}/{whole}" if whole else "-"


def render(outcome: Outcome) -> str:
    """The report the CLI prints: one line per defect, then the totals, the survivors, the killed
    cases whose diagnosis is wrong, the stated reasons, and the false alarms."""
    lines = [f"{'defect':28} {'expected diagnosis':19} {'killed':>7} {'bf16':>6} {'diagnosed':>9} {'reason':>6}"]
    totals = dict.fromkeys(("shown", "killed", "bf16", "bf16_killed", "diagnosed", "reason"), 0)
    for name, vs in outcome.verdicts.items():
        killed = sum(v.killed for v in vs)
        bf16 = [v for v in vs if v.bf16]
        diagnosed = sum(v.diagnosed for v in vs)
        reason = sum(v.explained and not v.diagnosed for v in vs)
        expected = vs[0].expected if vs else ""
        lines.append(f"{name:28} {expected:19} {_rate(killed, len(vs)):>7} "
                     f"{_rate(sum(v.killed for v in bf16), len(bf16)):>6} {_rate(diagnosed, killed):>9} "
                     f"{reason:>6}")
        for key, value in (("shown", len(vs)), ("killed", killed), ("bf16", len(bf16)),
                           ("bf16_killed", sum(v.killed for v in bf16)), ("diagnosed", diagnosed),
                           ("reason", reason)):
            totals[key] += value
    lines.append(f"kill rate: {_rate(totals['killed'], totals['shown'])} cases over {len(outcome.verdicts)} defects; "
                 f"bf16 compute only: {_rate(totals['bf16_killed'], totals['bf16'])}; "
                 f"diagnosis right: {_rate(totals['diagnosed'], totals['killed'])}, "
                 f"with a stated reason: {totals['reason']}")
    for name, v in outcome.survivors:
        lines.append(f"SURVIVED {name}: {v.case.id}" + (f" ({v.measured})" if v.measured else ""))
    for name, vs in outcome.verdicts.items():
        lines.extend(f"MISDIAGNOSED {name}: {v.case.id}: {v.diagnosis}" for v in vs if v.killed and not v.explained)
        reasons = sorted({v.reason for v in vs if v.killed and not v.diagnosed and v.reason})
        lines.extend(f"NO DIAGNOSIS POSSIBLE {name}: {r}" for r in reasons)
    for name, records in outcome.false_alarms.items():
        lines.append(f"false alarms on {name}: {len(records)}")
        lines.extend(f"  FALSE ALARM {r.check} {r.case_id} ratio {r.ratio:.3g}" for r in records)
    lines.append(f"selftest {'PASSED' if outcome.passed else 'FAILED'} in {outcome.seconds:.1f}s")
    return "\n".join(lines)


def main(limit: int = CASES_PER_DEFECT, stream: TextIO = sys.stdout) -> int:
    outcome = selftest(limit)
    print(render(outcome), file=stream)
    return 0 if outcome.passed else 1
