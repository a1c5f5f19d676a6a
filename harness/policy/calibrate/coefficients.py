"""Measure the tolerance coefficients of harness/policy/tolerance.py on one device class; write them as a
table (harness/policy/tables.py, kind "coefficient").

For every case of a tier (a distributed one as its single-process equivalent), optimizers.Muon runs on the
device and each step is compared with the FP64 oracle. A step needs rtol = (||err|| - storage allowance) / ||delta_ref||;
divided by u * max(1, A) (harness/policy/sensitivity.py: the amplification at the singular values of the
direction that step orthogonalizes) that is the step's coefficient c. Each case is measured twice: as
drawn, and with its gradients x 2^10 (the run the `scale` check judges against its own reference).
Per coefficient key (harness/policy/keys.py) the table records the worst c (the policy's coefficient is
its allowance: harness/policy/allowance.py), the median, the number of runs and the worst run's id.

Schedules a peer declares other than ours (harness/policy/keys.py SCHEDULES: Jiacheng You's quintics,
other Polar Express tables) are measured with --schedules NAME ...: every selected polynomial case run by
our optimizer with that schedule's coefficients and normaliser scale in place of its own (the standard
iteration, or the Gram one with our restarts on a Gram case): a correct implementation of the declared
schedule, never the peer. "newton_schulz" on the Gram cases measures Keller Jordan's quintic under the
Gram iteration (DeepSpeed's gram method). With --schedules only those runs are made (merge them in); with
--tier-of TARGET they are made on the cases of that target's own tier, the rows it is judged on.

Declared compute formats the tiers lack are measured by running the same polynomial cases with
Muon's compute dtype replaced: fp64 parameters computed in bf16 and in fp16, fp32 and bf16
parameters computed in fp16 (Gram Newton-Schulz peers compute in fp16). "huge" and "tiny" gradients
are left out of fp16 (OUT_OF_FP16_RANGE).
Runs with an SVD rank cut-off among their singular values or an ill-posed Dion2 selection are not
counted (no rtol judges them).

  python -m harness.policy.calibrate.coefficients --device cpu --out harness/policy/data/tolerance_cpu.json
  python -m harness.policy.calibrate.coefficients --device cuda --out harness/policy/data/tolerance_cuda.json
      [--tier ci|nightly|gpu] [--select SUBSTRING ...] [--skip REGEX] [--whole REGEX] [--every N]
      [--drawn N --drawn-seed S --optimizers NAME ... --per-key K] [--merge FILE ... [--drop REGEX]]
      [--shard I/N] [--schedules NAME ...] [--tier-of TARGET]

--drawn N also measures N cases drawn from cases.strategies.cases, the strategy the property tests
draw from (tests/test_properties.py, tests/test_dion2.py): any CI-sized layer, megabatch, 1-3 steps,
any seed and fraction, so every key a property test can reach is measured on the cases that reach
it, not only on the tiers' few (a rank-1 fp32 Polar Express key had 3 tier cases, all within the
storage allowance, and a Hypothesis case needed 4x its coefficient). --tier none measures drawn cases
alone; --per-key K skips a case whose key already has K measured cases (the --merge files' count too),
so the time goes to the keys few cases reach.
--merge FILE ... folds earlier tables into --out (harness/policy/calibrate `folded`: per key the worst of
all and its case, the median of the largest, counts summed); --drop REGEX leaves out the merged tables'
keys that match (stale ones, e.g. measured before their amplification changed).

The committed tolerance_cpu.json is a merge (its provenance lists every command): the whole nightly tier for
Muon and NorMuon, the CI tier's Dion2 and NorDion2 cases, and cases drawn by the property tests'
strategy (Muon, Dion2, NorDion2; --per-key for the rare keys), in the time a 2-core machine shared
by many allowed. Its Dion2/NorDion2 entries were re-measured after their amplification became that
of the selected submatrix (the older ones were dropped with --drop).
"""

from __future__ import annotations

import argparse
import platform
import re
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import torch

from cases import TIERS, Case, tier
from cases.axes import NONFINITE_GRADIENT
from harness.algorithms import algorithm
from harness.judging.checks import SCALE_FACTOR, reference_steps, unscalable
from harness.judging.metrics import compare_step
from harness.policy import keys, sensitivity, tables, tolerance
from harness.policy.bounds import STORAGE_ULPS
from harness.policy.calibrate import command, folded, provenance
from harness.policy.calibrate.panel import MEMBERS, OURS, build, label, own_cases, runs_case, single
from harness.policy.calibrate.variants import MEASURABLE, VARIANTS, DeclaredCompute
from harness.running import backends
from harness.running.selection import target_tier
from harness.targets import load_target
from harness.running.inputs import f64, make_inputs
from harness.targets.base import Target

OUT_OF_FP16_RANGE = ("huge", "tiny")
"""Gradient kinds outside fp16's range, left out of every fp16 variant: 1e10 overflows it (the oracle's
rounded direction is then infinite); 1e-10 underflows its smallest subnormal (6e-8), so the reference,
which rounds U to fp16 first, sees zeros or 1-2 significant bits while an implementation that
normalises before rounding (Gram Newton-Schulz: in fp32) does not: that measures the range, not
rounding (measured: c 6.1 for Muon's Polar Express, up to inf for Gram Newton-Schulz)."""



Run = tuple[Case, str, Target]
"""A measured run: the case, the panel member (harness/policy/calibrate/panel.py) and its target."""


def runs(cases: list[Case], schedules: tuple[str, ...] = (), members: tuple[str, ...] = (OURS,),
         own: dict[str, list[Case]] | None = None) -> list[Run]:
    """Every case run by each of `members` that runs it (ours first), each member also on its `own` cases (the
    rows its own tier adds: panel.own_cases), then ours' declared-compute variants of its polynomial cases; with
    `schedules`, instead, every polynomial case with each named schedule, run by each member that can declare it."""
    out: list[Run] = []
    for name in schedules or (None,):
        for member in members:
            target = build(member, name)
            if target is not None:
                out += [(c, member, target) for c in cases + (own or {}).get(member, [])
                        if not (name and c.orthogonalizer == "svd") and runs_case(member, target, c)]
    if schedules or OURS not in members:
        return out
    for c in cases:
        for compute in VARIANTS.get((c.param_dtype, c.compute_dtype), ()):
            if c.orthogonalizer != "svd" and not (compute == "fp16" and c.grad in OUT_OF_FP16_RANGE):
                out.append((c, OURS, DeclaredCompute(compute)))
    return out


def drawn(n: int, at: int, optimizers: tuple[str, ...]) -> list[Case]:
    """Up to `n` distinct cases drawn by the property tests' strategy, reproducibly (Hypothesis seed `at`)."""
    if not n:
        return []
    from hypothesis import (  # a test dependency: only for --drawn
        HealthCheck,
        Phase,
        given,
        seed,
        settings,
    )

    from cases import strategies
    found: list[Case] = []

    @seed(at)
    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategies.cases(optimizers=optimizers))
    def collect(case: Case) -> None:
        found.append(case)
    collect()
    return list(dict.fromkeys(found))


def policy_key(case: Case, target: Target) -> keys.Key:
    """The coefficient key of `case` as `target` declares it (from the FP64 oracle alone: cheap)."""
    conv = target.conventions(case)
    sens = sensitivity.of_case(case, conv, [[f64(g) for g in step] for step in make_inputs(case).grads])
    return keys.coefficient_key(case, conv, tolerance.conditioning_class(case, sens))


def measure(case: Case, target: Target, device: torch.device) -> list[tuple[keys.Key, float, str]]:
    """(policy key, worst coefficient c over the steps, which run) of the case's run and of its scaled
    run (gradients x SCALE_FACTOR, what the `scale` check judges against its own reference); a run is
    left out where an SVD rank cut-off sits among its direction's singular values, its selection is
    ill-posed, or some step's rtol at the least coefficient any key has is above ILL_POSED_RTOL
    (tolerance.unmeasurable_why): no rtol judges such a run, so it calibrates nothing (a plain bf16 NorMuon's
    scaled rank-deficient conv3d run needed c 5e4 where the case's reference is skipped as ill-posed)."""
    base = backends.on_device(make_inputs(case), device)
    out = []
    scaled = [] if unscalable(target.conventions(case).compute_dtype) else [
        (base.scaled(SCALE_FACTOR), f" scaled x {SCALE_FACTOR:g}")]
    for inputs, suffix in [(base, ""), *scaled]:
        traj = target.run(inputs.params, inputs.grads, case)
        conv = target.conventions(case)
        sens = sensitivity.of_case(case, conv, [[f64(g) for g in step] for step in inputs.grads])
        if tolerance.unmeasurable_why(case, conv, sens):
            continue
        u = tolerance.unit_roundoff(max((case.param_dtype, conv.compute_dtype), key=tolerance.unit_roundoff))
        margins: list[float] = []
        steps = list(reference_steps(case, target, inputs.params, inputs.grads, traj, margins))
        if algorithm(case).ill_posed(case, min(margins)):
            continue
        worst = 0.0
        for n, (_, x_prev, x_new, x_ref) in enumerate(steps):
            m = compare_step(x_prev, x_new, x_ref, case.param_dtype, 0.0, STORAGE_ULPS)
            needed = m.rel_err * max(0.0, 1.0 - 1.0 / m.ratio) if m.ratio > 0 else 0.0
            i, k = divmod(n, case.steps)
            worst = max(worst, needed / (u * max(1.0, sens[i][k].amplification)))
        out.append((keys.coefficient_key(case, conv, tolerance.conditioning_class(case, sens)), worst, suffix))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=tolerance.DEVICE_CLASSES)
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    parser.add_argument("--tier", default="nightly", choices=(*TIERS, "none"),
                        help="tier whose cases are measured (none: only --drawn cases)")
    parser.add_argument("--select", nargs="*", default=[], help="only cases whose id contains one of these")
    parser.add_argument("--skip", default=None, help="leave out cases whose id matches this regular expression")
    parser.add_argument("--whole", default=None, help="cases whose id matches this regular expression are all "
                        "measured, like the CI tier's")
    parser.add_argument("--every", type=int, default=1, help="every N-th of the other selected cases (the CI tier "
                        "is always measured whole)")
    parser.add_argument("--shard", default="0/1", help="I/N: only the I-th of N interleaved slices of the runs "
                        "(shards run in parallel and are merged)")
    parser.add_argument("--drawn", type=int, default=0, help="also N cases drawn by the property tests' strategy")
    parser.add_argument("--drawn-seed", type=int, default=0, help="Hypothesis seed of --drawn")
    parser.add_argument("--optimizers", nargs="+", default=["muon"], help="optimizers of --drawn cases")
    parser.add_argument("--merge", nargs="*", type=Path, default=[], help="tables folded into --out")
    parser.add_argument("--drop", default=None, help="keys of --merge tables left out (regular expression)")
    parser.add_argument("--schedules", nargs="+", default=[], choices=sorted(MEASURABLE),
                        help="measure these schedules (harness/policy/keys.py SCHEDULES, or ours by name) on the "
                        "polynomial cases, run by the --members that can declare them, instead of the cases' own")
    parser.add_argument("--tier-of", default=None, metavar="TARGET",
                        help="the cases of TARGET's own --tier (harness/running/selection.py) instead of the global "
                        "tier's: with --schedules, a peer's declared schedule on the rows it is judged on")
    parser.add_argument("--members", nargs="+", default=[OURS], choices=MEMBERS,
                        help="the panel members measured (harness/policy/calibrate/panel.py; default: ours)")
    parser.add_argument("--per-key", type=int, default=0, help="skip a case whose key already has this many "
                        "measured cases (--merge tables count): time goes to the keys few cases reach")
    args = parser.parse_args()
    if args.drawn < 0 or args.every < 1:
        parser.error("--drawn must be >= 0 and --every >= 1")
    missing = [str(p) for p in args.merge if not p.is_file()]
    if missing:
        parser.error(f"--merge: no such file {missing}")
    shard, shards = (int(x) for x in args.shard.split("/"))
    if not 0 <= shard < shards:
        parser.error(f"--shard {args.shard}: expected I/N with 0 <= I < N")
    start = time.perf_counter()
    merging_only = args.tier == "none" and not args.drawn  # folds --merge tables: no run, no device
    if args.device == "cuda" and not torch.cuda.is_available() and not merging_only:
        sys.exit("--device cuda: no CUDA device visible")
    device = backends.get(args.device).device() if not merging_only else torch.device("cpu")
    torch.set_num_threads(1)
    ci = set(map(single, tier("ci"))) if args.tier != "none" else set()
    # a non-finite gradient's reference is a pattern of NaN (the `nonfinite` check), no rounding to measure

    def kept(c: Case) -> bool:
        return ((not args.select or any(s in c.id for s in args.select))
                and not (args.skip and re.search(args.skip, c.id)) and c.grad != NONFINITE_GRADIENT)
    every = [] if args.tier == "none" else (tier(args.tier) if not args.tier_of
                                             else target_tier(args.tier, load_target(args.tier_of)).cases)
    chosen = [c for c in dict.fromkeys(map(single, every)) if kept(c)]
    whole = [c for c in chosen if c in ci or (args.whole and re.search(args.whole, c.id))]
    cases = whole + [c for c in chosen if c not in set(whole)][::args.every]
    measured = set(cases)
    cases += [c for c in drawn(args.drawn, args.drawn_seed, tuple(args.optimizers)) if c not in measured]
    measured = set(cases)
    own = {m: [c for c in own_cases(m, args.tier) if kept(c) and c not in measured]
           for m in args.members} if args.tier != "none" and not args.tier_of else {}
    todo = runs(cases, tuple(args.schedules), tuple(args.members), own)[shard::shards]
    found: dict[keys.Key, list[tuple[float, str]]] = defaultdict(list)
    by: dict[keys.Key, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    earlier = folded(tables.Table("coefficient", "", {"commands": []}, {}), args.merge, args.drop, runs_made=False)
    counts = Counter({k: e.n for k, e in earlier.entries.items()})
    ill_posed = skipped = ran = 0
    for n, (case, member, target) in enumerate(todo, 1):
        if args.per_key and counts[policy_key(case, target)] >= args.per_key:
            skipped += 1
            continue
        got = measure(case, target, device)
        attempted = 1 if unscalable(target.conventions(case).compute_dtype) else 2
        ran += attempted
        ill_posed += attempted - len(got)
        for key, worst, scaled in got:
            counts[key] += 1
            found[key].append((worst, case.id + label(member, target) + scaled))
            by[key][member].append(worst)
        if n % 100 == 0 or n == len(todo):
            spent = time.perf_counter() - start
            print(f"[{n}/{len(todo)}] {spent:.0f}s, ~{spent / n * (len(todo) - n):.0f}s left", file=sys.stderr,
                  flush=True)
    entries = {}
    print(f"{'key':42} {'n':>5} {'median c':>9} {'worst c':>9} {'policy c':>9}  worst case")
    for key, values in sorted(found.items(), key=lambda kv: str(kv[0])):
        v = np.array([c for c, _ in values])
        worst_c, worst_id = max(values)
        entries[key] = tables.Entry(int(v.size), {tolerance.STATISTIC: float(worst_c)},
                                    {tolerance.STATISTIC: float(np.median(v))}, {tolerance.STATISTIC: worst_id},
                                    {m: {tolerance.STATISTIC: {"worst": max(c), "n": len(c)}} for m, c in by[key].items()})
        print(f"{str(key):42} {v.size:5d} {np.median(v):9.3g} {worst_c:9.3g} {tolerance.coefficient(worst_c):9.3g}  "
              f"{worst_id}")
    seconds = time.perf_counter() - start
    name = torch.cuda.get_device_name() if args.device == "cuda" else (platform.processor() or platform.machine())
    made = tables.Table("coefficient", f"worst rounding coefficient c a correct implementation's step needed, per "
                                       f"key, on {args.device}",
                        provenance(command("coefficients"), f"{args.device}: {name}", tier=args.tier,
                                   cases=len(cases), runs=ran, ill_posed_not_counted=ill_posed,
                                   seconds=round(seconds, 1)),
                        entries, panel=tuple(args.members))
    table = folded(made, args.merge, args.drop, runs_made=not merging_only)
    tables.write(table, args.out)
    print(f"wrote {args.out}: {len(table.entries)} keys; this run {len(entries)} keys from {ran} runs ({ill_posed} "
          f"ill-posed, not counted; {skipped} cases skipped by --per-key) in {seconds:.0f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
