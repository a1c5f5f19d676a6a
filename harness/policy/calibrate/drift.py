"""Measure the noise of the `drift` robust check (harness/judging/robust_checks.py) on correct bf16
implementations, and write it as a table (harness/policy/tables.py, kind "drift"; harness/policy/noise.py
reads it).

`drift` runs DRIFT_FACTOR x a case's steps with the case's first gradients every step and compares the
accumulated displacement with the FP64 reference's. Its noise depends on the matrix shape, so it is
keyed per layer and matrix view (harness/policy/keys.py drift_key) and measured on the cases that carry the
check (harness.apps.selftest.DRIFT_CASES by default), each at seeds 0..N-1 (the seed draws the parameters
and the persistent gradient). Per key and implementation the table keeps the worst |value|, mean and
standard deviation of each statistic (`by`); the key's worst is the worst |drift| of the correct ones.

--members (harness/policy/calibrate/panel.py, default ours) are the correct implementations measured, each on
the cases it runs; the worst of all of them is the allowance's. Their error LEVEL may differ from ours (4x on one
case: it is implementation-specific, so it is not judged, nor centred); its growth over the trajectory is
what `drift` judges. --also TARGET ... measures targets for the record only (in `by`, never in the worst):
defects, to show their effect.

  python -m harness.policy.calibrate.drift [--seeds 8] [--jobs 1] [--cases ID ...]
      [--members MEMBER ...] [--also TARGET ...] [--merge FILE ... [--drop REGEX]]
      [--out harness/policy/data/bf16_drift_noise.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import platform
from pathlib import Path

import numpy as np
import torch

from cases import Case
from harness.judging import robust_checks
from harness.policy import keys, noise, tables
from harness.policy.calibrate import command, folded, provenance
from harness.policy.calibrate.panel import MEMBERS, OURS, build, runs_case
from harness.running.inputs import make_inputs
from harness.targets import load_target


def measure(job: tuple[str, str]) -> tuple[str, keys.Key, dict[str, float]] | None:
    """(target spec, drift key, statistics) of one case; None where the target does not run it (a panel member:
    where it does not or is known wrong)."""
    spec, case_id = job
    torch.set_num_threads(1)
    case = Case.from_id(case_id)
    target = build(spec) if spec in MEMBERS else load_target(spec)
    if target.unsupported(case) is not None or (spec in MEMBERS and not runs_case(spec, target, case)):
        return None
    compute = target.conventions(case).compute_dtype
    values = robust_checks.drift_statistics(case, target, make_inputs(case))
    return spec, keys.drift_key(case, compute), values


def summary(values: list[float]) -> tables.Summary:
    """Worst |value|, mean and standard deviation of the signed values, count."""
    return {"worst": float(np.max(np.abs(values))), "mean": float(np.mean(values)), "sd": float(np.std(values)),
            "n": len(values)}


def entries(results: list[tuple[str, keys.Key, dict[str, float]]], correct: list[str]) -> dict[keys.Key, tables.Entry]:
    """Per drift key: every implementation's summaries (`by`), the worst |drift| of the `correct` ones, and
    their runs counted."""
    per: dict[keys.Key, dict[str, dict[str, list[float]]]] = {}
    for spec, key, values in results:
        for stat, value in values.items():
            per.setdefault(key, {}).setdefault(spec, {}).setdefault(stat, []).append(value)
    out = {}
    for key, by_spec in per.items():
        by = {spec: {s: summary(v) for s, v in sorted(stats.items())} for spec, stats in by_spec.items()}
        judged = [by[spec]["drift"] for spec in correct if spec in by]
        if judged:
            out[key] = tables.Entry(sum(s["n"] for s in judged), {"drift": max(s["worst"] for s in judged)}, by=by)
    return out


def main() -> int:
    from harness.apps.selftest import DRIFT_CASES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8, help="every case at seeds 0..N-1")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--cases", nargs="*", default=[c.id for c in DRIFT_CASES])
    parser.add_argument("--members", nargs="+", default=[OURS], choices=MEMBERS,
                        help="the panel members measured (harness/policy/calibrate/panel.py; default: ours)")
    parser.add_argument("--also", nargs="*", default=[], help="other targets measured for the record")
    parser.add_argument("--merge", nargs="*", type=Path, default=[], help="tables folded into --out")
    parser.add_argument("--drop", default=None, help="keys of --merge tables left out (regular expression)")
    parser.add_argument("--out", type=Path, default=tables.DATA_DIR / noise.DRIFT_TABLE)
    args = parser.parse_args()
    ids = [dataclasses.replace(Case.from_id(i), seed=s).id for i in args.cases for s in range(args.seeds)]
    jobs = [(spec, i) for spec in [*args.members, *args.also] for i in ids]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        results = [r for r in pool.map(measure, jobs, chunksize=1) if r is not None]
    made = tables.Table("drift", "worst |drift| of correct bf16 implementations per drift key, over seeds (others "
                                 "measured for the record)",
                        provenance(command("drift"), f"cpu: {platform.machine()}"), entries(results, args.members),
                        {"factor": robust_checks.DRIFT_FACTOR}, tuple(args.members))
    table = folded(made, args.merge, args.drop, runs_made=bool(jobs))
    tables.write(table, args.out)
    for key, entry in table.entries.items():
        for spec, stats in entry.by.items():
            print(f"{spec:45} {str(key):62} " + "  ".join(
                f"{s} {x.get('mean', 0):.3g}±{x.get('sd', 0):.2g} (worst {x['worst']:.3g}, n {x['n']})"
                for s, x in stats.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
