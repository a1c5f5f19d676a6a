"""Measure the noise of the `drift` robust check (harness/judging/robust_checks.py) on a correct bf16
implementation (ours), and write harness/bf16_drift_noise.json, its tolerances' data.

`drift` runs DRIFT_FACTOR x a case's steps with the case's first gradients every step and compares the
accumulated displacement with the FP64 reference's. Its noise depends on the matrix shape, so it is
keyed per layer and matrix view (robust_checks.drift_key) and measured on the cases that carry the
check (harness.apps.selftest.DRIFT_CASES by default), each at seeds 0..N-1 (the seed draws the parameters
and the persistent gradient). Per key it keeps ours' worst |value|, mean and standard deviation of each
statistic.

--correct TARGET ... measures other correct bf16 implementations on the same cases (where they support
them), and their worst joins ours' in the tolerance: the plain op-by-op polynomial loop
`harness.apps.selftest_catalog:_POLYNOMIAL` (independent of ours' fused kernel) and torch.optim.Muon. Their
error LEVEL differs from ours (4x on one case: it is implementation-specific, so it is not judged, nor
centred); its growth over the trajectory is what `drift` judges. --also TARGET ... measures targets for
the record only ("others", never a tolerance): defects, to show their effect.

  python benchmarks/measure_bf16_drift_noise.py [--seeds 8] [--jobs 1] [--cases ID ...]
      [--correct TARGET ...] [--also TARGET ...] [--out harness/bf16_drift_noise.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import multiprocessing
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from cases import Case  # noqa: E402
from harness.judging import robust_checks  # noqa: E402
from harness.running.inputs import make_inputs  # noqa: E402
from harness.targets import load_target  # noqa: E402


def measure(job: tuple[str, str]) -> tuple[str, str, dict[str, float]] | None:
    """(target spec, drift key, statistics) of one case; None where the target does not support it."""
    spec, case_id = job
    torch.set_num_threads(1)
    case = Case.from_id(case_id)
    target = load_target(spec)
    if target.unsupported(case) is not None:
        return None
    compute = target.conventions(case).compute_dtype
    values = robust_checks.drift_statistics(case, target, make_inputs(case))
    return spec, robust_checks.drift_key(case, compute), values


def summary(values: list[float]) -> dict[str, float]:
    """Worst |value|, mean and standard deviation of the signed values, count."""
    return {"worst": float(np.max(np.abs(values))), "mean": float(np.mean(values)), "sd": float(np.std(values)),
            "n": len(values)}


def main() -> int:
    from harness.apps.selftest import DRIFT_CASES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8, help="every case at seeds 0..N-1")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--cases", nargs="*", default=[c.id for c in DRIFT_CASES])
    parser.add_argument("--correct", nargs="*", default=[], help="other correct targets: their worst joins ours' "
                        "in the tolerance, where they run the case")
    parser.add_argument("--also", nargs="*", default=[], help="other targets measured for the record")
    parser.add_argument("--out", type=Path, default=robust_checks.DRIFT_FILE)
    args = parser.parse_args()
    ids = [dataclasses.replace(Case.from_id(i), seed=s).id for i in args.cases for s in range(args.seeds)]
    jobs = [(spec, i) for spec in ["ours", *args.correct, *args.also] for i in ids]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        results = pool.map(measure, jobs, chunksize=1)
    per: dict[str, dict[str, dict[str, list[float]]]] = {}
    for spec, key, values in filter(None, results):
        for stat, value in values.items():
            per.setdefault(spec, {}).setdefault(key, {}).setdefault(stat, []).append(value)
    stats = {spec: {k: {s: summary(v) for s, v in sorted(d.items())} for k, d in sorted(keys.items())}
             for spec, keys in per.items()}
    ours = stats.pop("ours")
    worst = {k: {"drift": max(abs(v["drift"]["worst"]), *(abs(stats[c][k]["drift"]["worst"]) for c in args.correct
                                                              if k in stats.get(c, {})))}
             for k, v in ours.items()}
    data = {"about": "drift of optimizers.Muon (ours) per drift key, over seeds; written by "
                     "benchmarks/measure_bf16_drift_noise.py", "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "commands": ["python benchmarks/measure_bf16_drift_noise.py " + " ".join(sys.argv[1:])],
            "factor": robust_checks.DRIFT_FACTOR,
            "correct": ["ours", *args.correct], "worst": worst, "ours": ours, "others": stats}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    for spec, keys in [("ours", ours), *stats.items()]:
        for key, v in keys.items():
            print(f"{spec:45} {key:62} " + "  ".join(
                f"{s} {x['mean']:.3g}±{x['sd']:.2g} (worst {x['worst']:.3g}, n {x['n']})" for s, x in v.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
