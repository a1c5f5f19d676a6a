"""Measure the noise of the bf16-robust statistics (harness/judging/robust_checks.py) on correct bf16
implementations, and write it as a table (harness/policy/tables.py, kind "noise"; harness/policy/noise.py
reads it).

--members (harness/policy/calibrate/panel.py, default ours) are the implementations measured, each on the cases
it runs; per key the table keeps the worst over all of them and each one's own worst (`by`).
For every noise key (algorithm, parameter@compute dtype, orthogonalizer) with bf16 involved, it
runs the members over every CI layer x flatten x Nesterov x gradient kind
(robust_checks.GRADIENTS; seed 0, megabatch 1: members are independent; 3 steps, weight decay 0.1, lr modes
cycling; Dion2 and NorDion2 with fraction MEASURED_FRACTION and no Nesterov, which they lack),
computes every statistic
exactly as the checks do, and keeps per key the worst |value| and the number of cases. The larger
nightly layers are not measured (their bf16 runs cost minutes each on CPU), so the robust checks
judge only the measured layers.

--drawn N also measures the cases among N drawn by the property tests' strategy (cases.strategies,
as harness.policy.calibrate.coefficients --drawn) that the robust checks judge: any megabatch, 1-3 steps,
any seed, weight decay and fraction, so the noise of every key is measured where the property tests
reach it, not only on seed 0 at megabatch 1 (a drawn linear_row case with tiny gradients measured
its norm statistic at 1.1x the tolerance its key's 26 seed-0 cases gave). --tier none measures drawn
cases alone; --judged-ci adds the CI tier's cases the robust checks judge (as each member declares them),
the ones a correct implementation is judged on in CI; --seeds N measures every grid point at seeds 0..N-1 (the noise of a
matrix with one singular value, linear_row, is its one scalar's rounding: no averaging, so its worst
needs more draws); --skip REGEX leaves out cases whose id matches; --merge FILE ... folds earlier
tables into --out (per key and statistic the worst of all, counts summed; the measuring commands listed in
the provenance), --drop REGEX leaving out their keys that match (stale ones, measured
before their statistic changed).

--schedules NAME ... measures, instead of the cases' own schedules, every selected polynomial case run by each
member that can declare the named schedule's coefficients and normaliser scale (harness/policy/keys.py
SCHEDULES, or ours by option name on another orthogonalizer's cases; panel.build): the noise of correct
implementations of a schedule a peer declares, keyed as harness/policy/keys.py noise_key keys the peer
("muon/fp32@bf16/newton_schulz:you/gaussian"); --eps EPS runs it with that normaliser eps (a peer's own,
dion's 1e-8), which only the tiny gradients' keys carry ("tiny:eps1e-08"). The committed file's schedule
keys, each the orthogonalizer whose cases a built-in peer runs the schedule on (the table's commands
merge them in this order, each into the last):

  --seeds 4 --schedules you --skip '^(?!(muon|normuon)/.*/ns/)'            (dion, heavyball, gram-newton-schulz, emerging)
  --seeds 4 --schedules pe102 --skip '^(?!(muon|normuon)/.*/pe/)'          (dion, dtensor-muon)
  --seeds 4 --schedules you --eps 1e-8 --skip '^(?!(muon|normuon)/.*/ns/.*/tiny/)'    (dion's eps)
  --seeds 4 --schedules pe102 --eps 1e-8 --skip '^(?!(muon|normuon)/.*/pe/.*/tiny/)'  (dion's eps)
  --seeds 4 --schedules pe105 --skip '^(?!muon/.*/(pe|gns)/)'              (gram-newton-schulz)
  --seeds 4 --schedules pe4dp --skip '^(?!muon/.*/pe/)'                    (emerging-optimizers)

The one-row layer's own keys (harness/policy/keys.py one_singular_value) were then measured at --seeds 100 with
--skip '^(?!.*/linear_row-)' by the whole panel, and by each schedule command above with its --skip restricted
to linear_row ('^(?!(muon|normuon)/linear_row-.*/ns/)', ...).

  python -m harness.policy.calibrate.noise [--jobs N] [--out harness/policy/data/bf16_noise.json] [--tier ci|none]
      [--seeds N]
      [--skip REGEX] [--drawn N --drawn-seed S --optimizers NAME ...] [--merge FILE ... [--drop REGEX]]
      [--schedules NAME ... [--eps EPS]]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import multiprocessing
import platform
import re
import sys
from pathlib import Path

import numpy as np
import torch

from cases import Case, algorithms, axes
from harness.judging import checks, robust_checks
from harness.policy import keys, noise, tables
from harness.policy.calibrate import command, folded, provenance
from harness.policy.calibrate.coefficients import drawn
from harness.policy.calibrate.panel import MEMBERS, OURS, build, own_cases, runs_case
from harness.policy.calibrate.variants import MEASURABLE
from harness.running.inputs import make_inputs

MEASURED_FRACTION = 0.5
"""The fraction of slices Dion2 and NorDion2 select in the measurement."""


def measurement_cases(seeds: int = 1) -> list[Case]:
    """The cases measured: every bf16 noise key over every CI layer, flatten, Nesterov and seeds 0..seeds-1."""
    out = []
    cycle = itertools.count()
    # Gram Newton-Schulz last, so that adding it left the other keys' cases (and lr modes) as they were.
    grid = [*itertools.product(algorithms.names(), axes.DTYPE_PAIRS, axes.ORTHOGONALIZERS),
            *itertools.product(algorithms.names(), axes.DTYPE_PAIRS, (axes.GRAM,))]
    for optimizer, (pd, cd), orth in grid:
        if "bf16" not in (pd, cd) or not axes.compute_ok(orth, cd) or algorithms.entry(optimizer).elementwise:
            continue  # nothing orthogonalized by an elementwise algorithm: no statistic of its update
        for layer, (_, shape) in axes.LAYERS.items():
            selecting = optimizer in algorithms.selecting()
            for flatten, nesterov, seed, grad in itertools.product((False, True), (False, True), range(seeds),
                                                                   robust_checks.GRADIENTS):
                if (flatten and len(shape) < 3) or (selecting and nesterov):
                    continue
                out.append(Case(layer=layer, megabatch=1, flatten=flatten, param_dtype=pd, compute_dtype=cd,
                                orthogonalizer=orth, adjust_lr=axes.ADJUST_LR[next(cycle) % 3], nesterov=nesterov,
                                weight_decay=0.1, steps=3, grad=grad, seed=seed, optimizer=optimizer,
                                fraction=MEASURED_FRACTION if selecting else None))
    return out


Job = tuple[str, str, str | None, float | None]
"""(panel member, case id, schedule name or None, eps or None): one measured run (panel.build)."""


def measure(job: Job) -> tuple[str, keys.Key, dict[str, float] | None]:
    """The member, noise key and statistics of one run; None for the statistics of a panel member's run the
    `reference` check does not pass (against the FP64 oracle under the coefficient policy, or skipped as
    ill-posed): a member counts as a correct implementation only where it is judged right, and an allowance is
    the noise of correct runs alone (a textbook Polar Express normalised in bf16 can leave a rank-1 matrix's
    singular value above 1 and diverge; such runs moved `norm` by up to 4.5e13)."""
    torch.set_num_threads(1)
    member, case_id, schedule, eps = job
    case = Case.from_id(case_id)
    target = build(member, schedule, eps)
    inputs = make_inputs(case)
    traj = target.run(inputs.params, inputs.grads, case)
    conv = target.conventions(case)
    key = keys.noise_key(case, conv.compute_dtype, declared=conv.orthogonalizer)
    if member != OURS and checks.reference(case, target, inputs, traj).status != "pass":
        return member, key, None
    return member, key, robust_checks.statistics(case, target, inputs, traj)


def judged_ci() -> list[Case]:
    """The CI tier's single-process cases the robust checks judge."""
    from cases import ci_cases

    return [c for c in ci_cases() if robust_checks.applies(c, c.compute_dtype)]


def jobs_of(ids: list[str], members: list[str], schedules: list[str], eps: float | None,
            own: dict[str, list[str]] | None = None) -> list[Job]:
    """Each case run by each member that runs it, each member also on its `own` case ids (with each of
    `schedules` on its polynomial cases, if any)."""
    out: list[Job] = []
    shared = set(ids)
    for name in schedules or [None]:
        for member in members:
            target = build(member, name, eps)
            if target is None:
                continue
            for i in ids + [i for i in (own or {}).get(member, []) if i not in shared]:
                case = Case.from_id(i)
                if not (name and case.orthogonalizer == "svd") and runs_case(member, target, case):
                    out.append((member, i, name, eps))
    return out


def entries(results: list[tuple[str, keys.Key, dict[str, float] | None]]) -> dict[keys.Key, tables.Entry]:
    """Per key the worst |statistic| over every counted run (not those `measure` left out), its run count,
    and each member's own worst (`by`)."""
    per: dict[keys.Key, dict[str, dict[str, list[float]]]] = {}
    for member, key, values in results:
        if values is None:
            continue
        for stat, value in values.items():
            per.setdefault(key, {}).setdefault(member, {}).setdefault(stat, []).append(abs(value))
    out = {}
    for key, by_member in per.items():
        by = {m: {s: {"worst": float(np.max(v)), "n": len(v)} for s, v in stats.items()}
              for m, stats in by_member.items()}
        worst: dict[str, float] = {}
        for stats in by.values():
            for s, summary in stats.items():
                worst[s] = max(worst.get(s, 0.0), summary["worst"])
        out[key] = tables.Entry(sum(stats["norm"]["n"] for stats in by.values()), worst, by=by)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=max(1, multiprocessing.cpu_count()))
    parser.add_argument("--out", type=Path, default=tables.DATA_DIR / noise.NOISE_TABLE)
    parser.add_argument("--tier", default="ci", choices=("ci", "none"),
                        help="ci: the cases above; none: only --drawn cases")
    parser.add_argument("--seeds", type=int, default=1, help="ci: case seeds 0..N-1 at every grid point")
    parser.add_argument("--skip", default=None, help="leave out cases whose id matches this regular expression")
    parser.add_argument("--drawn", type=int, default=0, help="also the judged cases among N drawn by the "
                        "property tests' strategy")
    parser.add_argument("--drawn-seed", type=int, default=0, help="Hypothesis seed of --drawn")
    parser.add_argument("--optimizers", nargs="+", default=["muon"], help="optimizers of --drawn cases")
    parser.add_argument("--merge", nargs="*", type=Path, default=[], help="tables folded into --out")
    parser.add_argument("--drop", default=None, help="keys of --merge tables left out (regular expression)")
    parser.add_argument("--schedules", nargs="+", default=[], choices=sorted(MEASURABLE),
                        help="instead of the cases' own schedules, every selected polynomial case run with each of "
                             "these (harness/policy/keys.py SCHEDULES, or ours by option name)")
    parser.add_argument("--members", nargs="+", default=[OURS], choices=MEMBERS,
                        help="the panel members measured (harness/policy/calibrate/panel.py; default: ours)")
    parser.add_argument("--judged-ci", action="store_true", help="also the CI tier's cases the robust checks "
                        "judge (and each member's own CI-tier rows they judge: panel.own_cases)")
    parser.add_argument("--eps", type=float, default=None, help="with --schedules: the normaliser's eps (default "
                        "ours'); only tiny gradients' keys depend on it (harness/policy/keys.py EPS_GRADIENTS)")
    args = parser.parse_args()
    missing = [str(p) for p in args.merge if not p.is_file()]
    if args.drawn < 0 or args.seeds < 1 or missing:
        parser.error(f"--merge: no such file {missing}" if missing else "--drawn must be >= 0 and --seeds >= 1")
    if args.eps is not None and not args.schedules:
        parser.error("--eps needs --schedules")
    cases = measurement_cases(args.seeds) if args.tier == "ci" else []
    known = set(cases)
    cases += [c for c in judged_ci() if args.judged_ci and c not in known]
    known = set(cases)
    cases += [c for c in drawn(args.drawn, args.drawn_seed, tuple(args.optimizers))
              if robust_checks.applies(c, c.compute_dtype) and c not in known]
    ids = [c.id for c in cases if not (args.skip and re.search(args.skip, c.id))]
    own = {m: [c.id for c in own_cases(m, "ci") if robust_checks.applies(c, c.compute_dtype)
               and not (args.skip and re.search(args.skip, c.id))] for m in args.members} if args.judged_ci else {}
    jobs = jobs_of(ids, args.members, args.schedules, args.eps, own)
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        results = pool.map(measure, jobs, chunksize=4)
    wrong = collections.Counter(member for member, _, values in results if values is None)
    for member, count in sorted(wrong.items()):
        print(f"{member}: {count} of its runs not passing `reference`, left out", file=sys.stderr)
    made = tables.Table("noise", "worst |statistic| of correct bf16 implementations per bf16 noise key",
                        provenance(command("noise"), f"cpu: {platform.machine()}"), entries(results),
                        {"layers": sorted(axes.LAYERS)}, tuple(args.members))
    table = folded(made, args.merge, args.drop, runs_made=bool(jobs))
    tables.write(table, args.out)
    for key, entry in table.entries.items():
        print(f"{str(key):36} n={entry.n:4} " + "  ".join(f"{s} {v:.2e}" for s, v in entry.worst.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
