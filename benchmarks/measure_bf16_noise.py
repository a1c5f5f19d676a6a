"""Measure the noise of the bf16-robust statistics (harness/robust_checks.py) on a correct bf16
implementation (ours), and write harness/bf16_noise.json, the tolerances' data.

For every noise key (algorithm, parameter@compute dtype, orthogonalizer) with bf16 involved, it
runs ours over every CI layer x flatten x Nesterov x gradient kind
(robust_checks.GRADIENTS; seed 0, megabatch 1: members are independent; 3 steps, weight decay 0.1, lr modes
cycling; Dion2 and NorDion2 with fraction MEASURED_FRACTION and no Nesterov, which they lack),
computes every statistic
exactly as the checks do, and keeps per key the worst
|value|, the 99th percentile and the number of cases. The larger nightly layers are not measured
(their bf16 runs cost minutes each on CPU), so the robust checks judge only the measured layers.

  python benchmarks/measure_bf16_noise.py [--jobs N] [--out harness/bf16_noise.json]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import multiprocessing
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from cases import Case, axes  # noqa: E402
from harness import robust_checks  # noqa: E402
from harness.inputs import make_inputs  # noqa: E402
from harness.targets import load_target  # noqa: E402


MEASURED_FRACTION = 0.5
"""The fraction of slices Dion2 and NorDion2 select in the measurement."""


def measurement_cases() -> list[Case]:
    """The cases measured: every bf16 noise key over every CI layer, flatten, Nesterov (Gram Newton-Schulz
    for Muon only, the one algorithm whose cases take it)."""
    out = []
    cycle = itertools.count()
    for optimizer, (pd, cd), orth in itertools.product(axes.OPTIMIZERS, axes.DTYPE_PAIRS, axes.EVERY_ORTHOGONALIZER):
        if "bf16" not in (pd, cd) or not axes.compute_ok(orth, cd) or (orth == axes.GRAM and optimizer != "muon"):
            continue
        for layer, (_, shape) in axes.LAYERS.items():
            selecting = optimizer in axes.SELECTING
            for flatten, nesterov, seed, grad in itertools.product((False, True), (False, True), (0,),
                                                                   robust_checks.GRADIENTS):
                if (flatten and len(shape) < 3) or (selecting and nesterov):
                    continue
                out.append(Case(layer=layer, megabatch=1, flatten=flatten, param_dtype=pd, compute_dtype=cd,
                                orthogonalizer=orth, adjust_lr=axes.ADJUST_LR[next(cycle) % 3], nesterov=nesterov,
                                weight_decay=0.1, steps=3, grad=grad, seed=seed, optimizer=optimizer,
                                fraction=MEASURED_FRACTION if selecting else None))
    return out


def measure(case_id: str) -> tuple[str, dict[str, float]]:
    torch.set_num_threads(1)
    case = Case.from_id(case_id)
    target = load_target("ours")
    inputs = make_inputs(case)
    values = robust_checks.statistics(case, target, inputs, target.run(inputs.params, inputs.grads, case))
    return robust_checks.noise_key(case, case.compute_dtype), values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=max(1, multiprocessing.cpu_count()))
    parser.add_argument("--out", type=Path, default=robust_checks.NOISE_FILE)
    args = parser.parse_args()
    ids = [c.id for c in measurement_cases()]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        results = pool.map(measure, ids, chunksize=4)
    per_key: dict[str, dict[str, list[float]]] = {}
    for key, values in results:
        for stat, value in values.items():
            per_key.setdefault(key, {}).setdefault(stat, []).append(abs(value))
    worst = {k: {s: float(np.max(v)) for s, v in sorted(stats.items())} for k, stats in sorted(per_key.items())}
    p99 = {k: {s: float(np.percentile(v, 99)) for s, v in sorted(stats.items())} for k, stats in sorted(per_key.items())}
    counts = {k: len(next(iter(stats.values()))) for k, stats in sorted(per_key.items())}
    data = {"about": "worst |statistic| of optimizers.Muon (ours) per bf16 noise key; written by "
                     "benchmarks/measure_bf16_noise.py", "torch": torch.__version__,
            "date": datetime.date.today().isoformat(), "layers": sorted(axes.LAYERS), "cases": counts,
            "worst": worst, "p99": p99}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    for key in worst:
        print(f"{key:36} n={counts[key]:4} " + "  ".join(f"{s} {worst[key][s]:.2e}" for s in worst[key]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
