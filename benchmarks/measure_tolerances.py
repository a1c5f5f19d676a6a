"""Measure optimizers.Muon's error against the FP64 oracle per tolerance-policy key.

Prints, for every (param dtype, compute dtype, orthogonalizer, conditioning class), the
number of reference checks and the median, 99th percentile and worst rtol each
case needs (normwise relative error of the update beyond the parameter dtype's
storage rounding), over a tier's cases (default nightly), and the worst case's id.
Classes: "well" and "ill" split at tolerance.ILL_CONDITIONED; rank-1 layers (1 x n) apart.
Ill-posed cases (skipped by the harness) are not counted. These figures back
the `measured` column of harness/tolerance.py.

  python benchmarks/measure_tolerances.py [--tier ci|nightly] [--select SUBSTRING]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict

import numpy as np
import torch

from cases import tier
from harness import tolerance
from harness.checks import reference
from harness.inputs import make_inputs
from harness.targets.ours import target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", default="nightly", choices=("ci", "nightly"))
    parser.add_argument("--select", default="", help="only cases whose id contains this")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # rtol 0 leaves only the storage allowance, so (ratio - 1) / ratio * rel_err is the rtol a case needs.
    for key in tolerance.POLICY:
        tolerance.POLICY[key] = tolerance.Entry(0.0, 0.0, "measuring", "")
    ours = target()
    errors: dict[tuple[str, str, str, str], list[tuple[float, str]]] = defaultdict(list)
    # Distributed cases repeat single-process ones; their layouts are judged by their own checks.
    cases = [c for c in tier(args.tier) if args.select in c.id and c.layout == "single"]
    start = time.perf_counter()
    for n, case in enumerate(cases, 1):
        inputs = make_inputs(case)
        out = reference(case, ours, inputs, ours.run(inputs.params, inputs.grads, case))
        m = out.metrics
        if math.isfinite(m.rel_err):
            needed = m.rel_err * max(0.0, 1.0 - 1.0 / m.ratio) if m.ratio > 0 else 0.0
            group = ("rank-1" if case.shape[0] == 1 else
                     "ill" if inputs.condition > tolerance.ILL_CONDITIONED else "well")
            errors[(case.param_dtype, case.compute_dtype, case.orthogonalizer, group)].append((needed, case.id))
        if n % 200 == 0:
            print(f"[{n}/{len(cases)}] {time.perf_counter() - start:.0f}s", file=sys.stderr, flush=True)
    print(f"{'param@compute':14} {'orthogonalizer':14} {'class':9} {'n':>5} {'median':>9} {'p99':>9} "
          f"{'worst':>9}  worst case")
    for (pd, cd, orth, grad), values in sorted(errors.items()):
        v = np.array([e for e, _ in values])
        worst = max(values)[1]
        print(f"{pd + '@' + cd:14} {orth:14} {grad:9} {v.size:5d} {np.median(v):9.2e} {np.quantile(v, 0.99):9.2e} "
              f"{v.max():9.2e}  {worst}")


if __name__ == "__main__":
    main()
