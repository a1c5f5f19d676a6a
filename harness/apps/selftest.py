"""`python -m harness selftest`: the harness's detection power, proven on itself.

Every defect of the catalog (harness/apps/selftest_catalog.py) runs through exactly the path a
third-party target takes (its Target, harness.runner.run, every check, the diagnosis) on the
CI-tier cases where it can show: those its `shows` names, minus the ill-posed ones (bf16 with
rank-deficient gradients, judged for finiteness only; a Dion2 selection within rounding of a tie)
and, single-process, those where the defect leaves the mathematics alone (its fp64 updates within
SHOWS of ours), where its run is bitwise its baseline's (the same code with the defect undone: the
rounding absorbed it), and, with bf16, where it is hidden by noise: on every check its effect
(measured on the case's fp64 twin) is within the check's allowance plus the value a correct run
(ours) shows there, so no check could flag it whatever the noise (`visibility`; the selftest prints
these cases with the numbers, HIDDEN BY NOISE). At most CASES_PER_DEFECT, half of them with bf16
compute where there are such. The correct targets (ours, and torch on the cases it supports outside
its known finding: CORRECT) run on every chosen case. CI runs the quick tier (`candidates`: the first such case with bf16 compute
and the first without) as one test per defect, tests/test_selftest_catalog.py. Reported:

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
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, Sequence, TextIO

import torch

from cases import Case, axes, ci_cases
from harness.algorithms import algorithm
from harness.apps.selftest_catalog import CATALOG, Defect, spec
from harness.judging import checks, diagnosis, registry, robust_checks
from harness.judging.outcome import Outcome as CheckOutcome
from harness.policy import noise as measured_noise
from harness.policy import tolerance
from harness.policy.bounds import Tolerance
from harness.runner import run, run_case
from harness.running.inputs import Inputs, make_inputs
from harness.targets import load_target
from harness.running.selection import target_tier
from harness.targets.base import Target
from harness.targets.torch_builtin import findings
from oracles import Conventions
from reports import Record

CASES_PER_DEFECT = 6

DRIFT_CASES: tuple[Case, ...] = tuple(Case.from_id(i) for i in (
    "muon/linear-12x20/mb1/noflat/fp32@bf16/ns/spectral_norm/nesterov/wd0/steps8/gaussian/seed0",
    "muon/linear_tall-24x6/mb1/noflat/fp32@bf16/ns/rms_norm/plain/wd0/steps8/gaussian/seed0",
    "muon/conv2d-8x4x3x3/mb1/flat/fp32@bf16/ns/spectral_norm/nesterov/wd0/steps8/gaussian/seed0",
    "normuon/linear_tall-24x6/mb1/noflat/fp32@bf16/ns/spectral_norm/nesterov/wd0/steps8/gaussian/seed0",
))
"""The selftest's own long cases, after the CI tier: 8 steps, so that the `drift` robust check runs its
128-step persistent-gradient trajectory there (robust_checks.DRIFT_MIN_STEPS; too slow for the CI tier).
Matrix layers with fp32 parameters and bf16 compute, where a bf16 momentum buffer, which no CI bf16 case
shows, is measured against the drift noise of correct bf16 implementations (harness/policy/noise.py).
Newton-Schulz: the same cases with Polar Express are ill-posed for the reference at 8 steps (rtol 0.36 >
0.25: amplification ~370 of the orthogonalized direction), so the selftest would pass over them."""


def selftest_tier() -> list[Case]:
    """The cases the selftest chooses from: the CI tier, then DRIFT_CASES."""
    return ci_cases() + list(DRIFT_CASES)


CORRECT: Mapping[str, Callable[[Case], str | None]] = types.MappingProxyType(
    {"ours": lambda case: None, "torch": findings})
"""The correct targets, each with where it is known not to be (its findings): no false alarm there."""


@dataclass(frozen=True)
class Narrow:
    """A narrow adapter's view of the case space: `refuses(case)` says why it cannot run a case, as an
    adapter's `unsupported` does (None: it can). The defects run through it are judged on its own tier
    (harness/running/selection.py), as a user's narrow optimizer is."""

    name: str
    refuses: Callable[[Case], str | None]
    about: str


def _readme_view(case: Case) -> str | None:
    if case.optimizer != "muon" or len(case.shape) != 2 or case.world_size > 1:
        return "Muon for 2-D parameters, one process"
    if case.orthogonalizer != "newton_schulz" or case.compute_dtype != "fp32":
        return "Newton-Schulz in fp32 only"
    return None if case.adjust_lr == "spectral_norm" else "one lr scale"


def _deepspeed_view(case: Case) -> str | None:
    if case.optimizer != "muon" or case.world_size > 1:
        return "Muon, one process"
    if case.orthogonalizer != "newton_schulz" or case.compute_dtype != "bf16" or not case.nesterov:
        return "Keller Jordan's quintic in bf16, Nesterov always"
    return None if case.adjust_lr == "spectral_norm" else "one lr scale"


NARROW = (
    Narrow("readme-2d-fp32", _readme_view, "the README's adapter: Muon for 2-D weights, Newton-Schulz in fp32, "
                                           "one lr scale"),
    Narrow("deepspeed-like", _deepspeed_view, "as DeepSpeed's SingleDeviceMuon: Muon, Keller Jordan's quintic, "
                                              "Nesterov always, one lr scale, bf16 compute"),
)
"""The narrow adapters every defect also runs through (a narrow target must meet its own bugs)."""


class Restricted(Target):
    """`inner` seen through a narrow adapter: it supports only what `narrow` accepts, and runs as `inner`."""

    def __init__(self, inner: Target, narrow: Narrow) -> None:
        self.inner, self.narrow = inner, narrow
        self.name = f"{inner.name}@{narrow.name}"
        self.exact_relations, self.exact_equivalents = inner.exact_relations, inner.exact_equivalents

    def version(self) -> str:
        return self.inner.version()

    def unsupported(self, case: Case) -> str | None:
        return self.narrow.refuses(case) or self.inner.unsupported(case)

    def conventions(self, case: Case) -> Conventions:
        return self.inner.conventions(case)

    def run(self, params: Sequence[torch.Tensor], grads: Sequence[Sequence[torch.Tensor]],
            case: Case) -> list[list[torch.Tensor]]:
        return self.inner.run(params, grads, case)


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
    hidden: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    """Per defect, the cases passed over as hidden by noise, with the measured numbers (why_hidden)."""
    narrow: dict[str, dict[str, list[Verdict]]] = dataclasses.field(default_factory=dict)
    """Per narrow adapter (NARROW), the verdicts of each defect on that adapter's own tier."""

    @property
    def survivors(self) -> list[tuple[str, Verdict]]:
        views = [("", self.verdicts), *((f"@{n}", v) for n, v in self.narrow.items())]
        return [(name + at, v) for at, verdicts in views for name, vs in verdicts.items() for v in vs if not v.killed]

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


def bitwise(target: Target, baseline: Target, case: Case) -> bool:
    """Whether the defect's trajectory on `case`, in the case's own dtypes, is bitwise its baseline's
    (the same code with the defect undone): then the rounding has absorbed the defect and no check of
    any harness can see it (momentum rounded to bf16 for one step whose orthogonalization rounds its
    input to bf16 anyway; eps = 1e-2 added to a norm of 15 held in bf16)."""
    inputs = make_inputs(case)
    a = target.run(inputs.params, inputs.grads, case)
    b = baseline.run(inputs.params, inputs.grads, case)
    return all(torch.equal(x, y) for sa, sb in zip(a, b) for x, y in zip(sa, sb))


def selection_ill_posed(target: Target, case: Case) -> bool:
    """Whether the reference skips `case` for `target` as ill-posed: a Dion2 selection whose margin
    along the target's trajectory is within its momentum dtype's rounding (single-process)."""
    if case.layout != "single":
        return False
    inputs = make_inputs(case)
    margins: list[float] = []
    traj = target.run(inputs.params, inputs.grads, case)
    for _ in checks.reference_steps(case, target, inputs.params, inputs.grads, traj, margins):
        pass
    return algorithm(case).ill_posed(case, min(margins)) is not None


@dataclass(frozen=True)
class Visibility:
    """One check (or one statistic of a bf16-robust check) on a case with bf16: the defect's effect
    free of rounding noise (its run of the case's fp64 twin; an exact relation's value on the case
    itself, which no noise blurs), what the check allows there, and a correct
    run's own value there (ours: the noise the defect's run also carries). The check flags the defect
    whatever that noise's sign only when effect > allowed + noise."""

    check: str
    effect: float
    allowed: float
    noise: float

    @property
    def shows(self) -> bool:
        return self.effect > self.allowed + self.noise

    def __str__(self) -> str:
        return f"{self.check} {self.effect:.2g} vs {self.allowed:.2g} + {self.noise:.2g}"


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def _exact(tol: Tolerance | None) -> bool:
    """An exact relation (probe, rescale, a bitwise megabatch): no rtol, only the storage rounding."""
    return tol is not None and tol.rtol == 0.0


def _relative_allowed(out: CheckOutcome) -> float:
    """The allowance of a normwise outcome relative to the reference step (rel_err / ratio)."""
    m = out.metrics
    if 0.0 < m.ratio < math.inf and math.isfinite(m.rel_err):
        return m.rel_err / m.ratio
    return out.tolerance.rtol if out.tolerance is not None else math.nan


def visibility(target: Target, ours: Target, case: Case) -> list[Visibility]:
    """Per check judged on `case` (single process, bf16 involved): the defect's effect (its fp64 twin:
    the case with fp64 dtypes, judged by the same check; for an exact relation, which no rounding
    noise blurs, its value on `case` itself), the check's allowance for the defect on `case`, and
    ours' own value on `case`. Robust statistics (norm, decay, sv_mean, ...) count one by
    one, their allowance that of the measured noise (harness/policy/noise.py)."""
    twin = dataclasses.replace(case, param_dtype="fp64", compute_dtype="fp64")
    inputs, twin_inputs = make_inputs(case), make_inputs(twin)
    traj = target.run(inputs.params, inputs.grads, case)
    mine = ours.run(inputs.params, inputs.grads, case)
    twin_traj = target.run(twin_inputs.params, twin_inputs.grads, twin)
    compute = target.conventions(case).compute_dtype
    statistic_checks = set(robust_checks.STATISTIC_CHECKS) & set(registry.robust_applicable(case, compute))
    out = []
    for name in registry.applicable(case):
        if name in statistic_checks:
            continue
        theirs = registry.judge(name)(case, target, inputs, [traj])
        noise = registry.judge(name)(case, ours, inputs, [mine])
        if theirs.status not in ("pass", "fail") or noise.status != "pass":
            continue  # not judged here (skipped, unsupported)
        if _exact(theirs.tolerance):  # no rounding noise to see through: its value on the case is the effect
            effect = _finite(theirs.metrics.rel_err)
        else:
            exact = registry.judge(name)(twin, target, twin_inputs, [twin_traj])
            effect = exact.metrics.rel_err
            if math.isnan(effect):  # finite: a verdict, no error size
                effect = math.inf if exact.status == "fail" else 0.0
        out.append(Visibility(name, effect, _relative_allowed(theirs), _finite(noise.metrics.rel_err)))
    if statistic_checks:
        judged = {s for c in statistic_checks for s in robust_checks.STATISTIC_CHECKS[c]}
        exact = robust_checks.statistics(twin, target, twin_inputs, twin_traj, resolved_as=case)
        noise = robust_checks.statistics(case, ours, inputs, mine)
        measured = measured_noise.of_case(case, compute)
        for stat in sorted(judged & set(measured.worst if measured else ()) & set(exact)):
            out.append(Visibility(stat, abs(exact[stat]), measured.allowed(stat),
                                  abs(noise.get(stat, 0.0))))
    drift = measured_noise.of_drift(case, compute, robust_checks.DRIFT_FACTOR) if "drift" in statistic_checks else None
    if drift:  # a norm of the accumulated error, measured on the case itself (see drift_visibility)
        out.append(drift_visibility(target, ours, case, inputs, drift.allowed("drift")))
    return out


def drift_visibility(target: Target, ours: Target, case: Case, inputs: Inputs, allowed: float) -> Visibility:
    """`drift`'s Visibility: its statistic is a norm of the accumulated error, not a signed mean that an
    fp64 twin could give free of noise, and the defects it is for act through the rounding (a bf16 buffer's
    stagnation; a safety factor that exists for bf16 rounding): the defect's value on the case itself, set
    against the allowance plus ours' value on the same case (the rounding both runs carry)."""
    theirs = robust_checks.drift_statistics(case, target, inputs)["drift"]
    mine = robust_checks.drift_statistics(case, ours, inputs)["drift"]
    return Visibility("drift", math.inf if math.isnan(theirs) else abs(theirs), allowed,
                      abs(_finite(mine)))


def distributed_visibility(target: Target, target_spec: str, ours: Target, case: Case) -> list[Visibility]:
    """`visibility` of a distributed case, from the records of the three runs (its checks run on the
    ranks): the defect on the case and on its fp64 twin, ours on the case."""
    twin = dataclasses.replace(case, param_dtype="fp64", compute_dtype="fp64")
    noise = {r.check: r for r in run_case(case, ours, "ours")}
    exact = {r.check: r for r in run_case(twin, target, target_spec)}
    out = []
    for r in run_case(case, target, target_spec):
        n, e = noise.get(r.check), exact.get(r.check)
        if r.status not in ("pass", "fail") or n is None or n.status != "pass" or e is None:
            continue
        allowed = r.rel_err / r.ratio if 0.0 < r.ratio < math.inf and math.isfinite(r.rel_err) else r.tolerance
        if r.tolerance == 0.0:  # an exact relation: its value on the case is the effect
            effect_ = _finite(r.rel_err)
        else:
            effect_ = e.rel_err if not math.isnan(e.rel_err) else (math.inf if e.failing else 0.0)
        out.append(Visibility(r.check, effect_, allowed, _finite(n.rel_err)))
    return out


def hidden_by_noise(target: Target, target_spec: str, ours: Target, case: Case) -> str | None:
    """Why the defect cannot show on `case` though it changes the mathematics there: bf16 is involved
    and on every check its effect is within the allowance plus the noise (Visibility); the measured
    numbers, or None where some check must flag it (and on cases without bf16)."""
    if "bf16" not in (case.param_dtype, case.compute_dtype):
        return None
    seen = (visibility(target, ours, case) if case.layout == "single"
            else distributed_visibility(target, target_spec, ours, case))
    if any(v.shows for v in seen):
        return None
    return "effect vs allowed + noise: " + ", ".join(map(str, seen))


def can_show(defect: Defect, target: Target, ours: Target, case: Case) -> bool:
    """`defect.shows(case)`, the case is not ill-posed (bf16 with rank-deficient gradients: judged
    for finiteness only; a Dion2 selection within rounding of a tie), and (single-process) the
    defect changes the fp64 updates by > SHOWS and its trajectory in the case's own dtypes is not
    bitwise its baseline's; and with bf16 some check's allowance plus the noise is below its effect
    (hidden_by_noise)."""
    return why_hidden(defect, target, ours, case) is None


def why_hidden(defect: Defect, target: Target, ours: Target, case: Case) -> str | None:
    """Why `defect` cannot show on `case` (can_show): "" for the rules that need no numbers, the
    measured effect against noise for hidden_by_noise; None where it can show."""
    if not defect.shows(case):
        return ""
    try:
        if checks.policy(case, ours, make_inputs(case)).ill_posed() or selection_ill_posed(target, case):
            return ""
    except tolerance.NoEntry:  # a harness gap: the defect cannot be judged there
        return ""
    if case.layout == "single":
        baseline = ours if defect.baseline is None else defect.baseline()
        if effect(target, ours, case) <= SHOWS or bitwise(target, baseline, case):
            return ""
    return hidden_by_noise(target, spec(defect), ours, case)


def candidates(defect: Defect, target: Target, ours: Target, tier: list[Case], bf16: bool, limit: int,
               hidden: dict[str, str] | None = None) -> list[Case]:
    """The first `limit` cases of `tier` (in order: deterministic) with bf16 compute or without, of
    the defect's kind (distributed or single-process), where it can show; `hidden` (if given)
    collects the cases passed over as hidden by noise, with their measured numbers."""
    chosen: list[Case] = []
    for c in tier:
        if len(chosen) >= limit:
            break
        if (c.compute_dtype == "bf16") != bf16 or (c.layout != "single") != defect.distributed:
            continue
        if c.grad in (axes.EXTREME_GRADIENT, axes.NONFINITE_GRADIENT):
            continue  # the range and non-finite cases judge the normaliser and the NaN policy, not the catalog's defects
        why = why_hidden(defect, target, ours, c)
        if why is None:
            chosen.append(c)
        elif why and hidden is not None:
            hidden[c.id] = why
    return chosen


def choose(defect: Defect, target: Target, ours: Target, tier: list[Case], limit: int = CASES_PER_DEFECT,
           hidden: dict[str, str] | None = None) -> list[Case]:
    """Up to `limit` CI cases where `defect` can show, up to half of them with bf16 compute, in
    tier order (deterministic); `hidden` as in `candidates`."""
    bf16 = candidates(defect, target, ours, tier, True, limit // 2, hidden)
    return bf16 + candidates(defect, target, ours, tier, False, limit - len(bf16), hidden)


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


def survivor_evidence(defect: Defect, ours: Target, case: Case) -> str:
    """The measured argument printed beside a survivor: with bf16, each check's effect against its
    allowance plus the noise (Visibility); else, single-process, how far the defect moves the update
    in fp64 against ours' own error there."""
    target = defect.make()
    if "bf16" in (case.param_dtype, case.compute_dtype):
        seen = (visibility(target, ours, case) if case.layout == "single"
                else distributed_visibility(target, spec(defect), ours, case))
        return "effect vs allowed + noise: " + ", ".join(map(str, seen))
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
        measured = "" if failing else survivor_evidence(defect, load_target("ours"), c)
        verdicts.append(Verdict(c, bool(failing), failing[0].diagnosis if failing else "", defect.expected,
                                defect.ambiguous(c), measured))
    return verdicts


def false_alarms(cases: list[Case]) -> dict[str, list[Record]]:
    """Failing records of each correct target (CORRECT) on `cases`, outside its known findings."""
    return {name: [r for r in _run_all([c for c in cases if known(c) is None], load_target(name), name) if r.failing]
            for name, known in CORRECT.items()}


def selftest(limit: int = CASES_PER_DEFECT, defects: tuple[Defect, ...] = CATALOG,
             views: tuple[Narrow, ...] = NARROW) -> Outcome:
    """Run every defect and the correct targets; see the module docstring. Every single-process defect also
    runs through each narrow adapter of `views`."""
    start = time.perf_counter()
    torch.set_num_threads(1)
    tier = selftest_tier()
    ours = load_target("ours")
    verdicts: dict[str, list[Verdict]] = {}
    hidden: dict[str, dict[str, str]] = {}
    union: dict[str, Case] = {}
    for defect in defects:
        cases = choose(defect, defect.make(), ours, tier, limit, hidden.setdefault(defect.name, {}))
        union.update({c.id: c for c in cases})
        verdicts[defect.name] = judge(defect, cases)
    narrow = {view.name: through(view, defects, ours, limit) for view in views}
    return Outcome(verdicts, false_alarms(list(union.values())), time.perf_counter() - start, hidden, narrow)


def through(view: Narrow, defects: tuple[Defect, ...], ours: Target, limit: int) -> dict[str, list[Verdict]]:
    """Each single-process defect seen through the narrow adapter `view`, on the cases of that adapter's own
    CI tier where it can show (up to `limit`, half with bf16 compute where there are such)."""
    tier = list(target_tier("ci", Restricted(ours, view)).cases)
    out = {}
    for defect in defects:
        if not defect.distributed:
            out[defect.name] = judge(defect, choose(defect, Restricted(defect.make(), view), ours, tier, limit))
    return out


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
    for name, cases in outcome.hidden.items():
        lines.extend(f"HIDDEN BY NOISE {name}: {case_id} ({why})" for case_id, why in cases.items())
    for name, vs in outcome.verdicts.items():
        lines.extend(f"MISDIAGNOSED {name}: {v.case.id}: {v.diagnosis}" for v in vs if v.killed and not v.explained)
        reasons = sorted({v.reason for v in vs if v.killed and not v.diagnosed and v.reason})
        lines.extend(f"NO DIAGNOSIS POSSIBLE {name}: {r}" for r in reasons)
    for view, verdicts in outcome.narrow.items():
        shown = [v for vs in verdicts.values() for v in vs]
        bf16 = [v for v in shown if v.bf16]
        lines.append(f"through {view}: kill rate {_rate(sum(v.killed for v in shown), len(shown))} cases over "
                     f"{sum(1 for vs in verdicts.values() if vs)} defects that can show there; bf16 compute only: "
                     f"{_rate(sum(v.killed for v in bf16), len(bf16))}")
    for name, records in outcome.false_alarms.items():
        lines.append(f"false alarms on {name}: {len(records)}")
        lines.extend(f"  FALSE ALARM {r.check} {r.case_id} ratio {r.ratio:.3g}" for r in records)
    lines.append(f"selftest {'PASSED' if outcome.passed else 'FAILED'} in {outcome.seconds:.1f}s")
    return "\n".join(lines)


def main(limit: int = CASES_PER_DEFECT, stream: TextIO = sys.stdout) -> int:
    outcome = selftest(limit)
    print(render(outcome), file=stream)
    return 0 if outcome.passed else 1
