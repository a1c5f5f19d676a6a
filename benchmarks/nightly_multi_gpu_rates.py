"""Where a distributed case's time goes, measured on gloo here, and what the nightly tier then costs.

    python benchmarks/nightly_multi_gpu_rates.py [--per-world-size 2] [--world-sizes 2,3,...] [--seed 0]

Samples `--per-world-size` nightly cases of each world size (seeded), runs them on one RankPool per
world size (gloo, CPU ranks), as a run does, and times:

  start    spawning the pool's ranks, importing torch there and the FileStore rendezvous (paid once
           per (backend, world size) in a run, and again after a failed case)
  ranks    per case, on the ranks: inputs, layout, the distributed steps, the pieces sent back (the
           first case of a pool also loads the target there: "first" below)
  oracle   the parent's judging: every check of the case (FP64 reference steps, tolerance policy,
           the single-process rerun of `layout`), split by check

and prints each case's checks and verdicts, the medians per world size, and the tier's estimated
wall time and case-checks per hour at these rates (the tier's case count per world size times the
median case, plus one pool start per world size).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from cases import tier  # noqa: E402
from harness.judging import registry  # noqa: E402
from harness.running.inputs import make_inputs  # noqa: E402
from harness.running.pool import RankPool  # noqa: E402
from harness.running.ranks import rank_trajectory  # noqa: E402
from harness.targets import load_target  # noqa: E402


def measure(pool: RankPool, case, target) -> dict:
    """Timings (seconds) and verdicts of one distributed case on `pool`."""
    t0 = time.perf_counter()
    result = pool.run(rank_trajectory, case.id, "ours")
    ranks = time.perf_counter() - t0
    if not result.ok:
        return dict(case=case.id, ranks=ranks, checks={}, verdicts={"ranks": "error"})
    inputs, checks, verdicts = make_inputs(case), {}, {}
    for name in registry.applicable(case):
        t0 = time.perf_counter()
        out = registry.judge(name)(case, target, inputs, result.values)
        checks[name] = time.perf_counter() - t0
        verdicts[name] = ("unsupported" if out.unsupported else "skipped" if out.skipped
                          else f"{'pass' if out.metrics.ratio <= 1 else 'FAIL'} {out.metrics.ratio:.3g}")
    return dict(case=case.id, ranks=ranks, checks=checks, verdicts=verdicts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-world-size", type=int, default=2)
    parser.add_argument("--world-sizes", default=None, help="comma-separated (default: every one of the tier)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tier", default="nightly")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = [c for c in tier(args.tier) if c.layout != "single"]
    counts = Counter(c.world_size for c in cases)
    sizes = sorted(counts) if args.world_sizes is None else [int(w) for w in args.world_sizes.split(",")]
    rng, target = random.Random(args.seed), load_target("ours")
    rows: dict[int, list[dict]] = {}
    starts: dict[int, float] = {}
    for w in sizes:
        t0 = time.perf_counter()
        pool = RankPool("gloo", w)
        starts[w] = time.perf_counter() - t0
        print(f"ws{w} pool start {starts[w]:.2f}s", flush=True)
        try:
            for n, case in enumerate(rng.sample([c for c in cases if c.world_size == w], args.per_world_size)):
                row = measure(pool, case, target)
                rows.setdefault(w, []).append(row)
                print(f"ws{w} ranks {row['ranks']:.2f}s{' (first)' if n == 0 else ''} oracle "
                      f"{sum(row['checks'].values()):.2f}s ({', '.join(f'{k} {v:.2f}s' for k, v in row['checks'].items())}) "
                      f"[{', '.join(f'{k} {v}' for k, v in row['verdicts'].items())}] {row['case']}", flush=True)
        finally:
            pool.close()
    total, checks = 0.0, 0
    print("\nworld size | tier cases | start s | ranks s/case (after the first) | oracle s/case | checks/case | est. tier s")
    for w, got in rows.items():
        start = starts[w]
        ranks = statistics.median(r["ranks"] for r in (got[1:] or got))  # the first loads the target
        oracle = statistics.median(sum(r["checks"].values()) for r in got)
        per_case = statistics.mean(len(r["checks"]) for r in got)
        estimate = start + counts[w] * (ranks + oracle)
        total, checks = total + estimate, checks + counts[w] * per_case
        print(f"{w} | {counts[w]} | {start:.2f} | {ranks:.2f} | {oracle:.2f} | {per_case:.1f} | {estimate:.0f}")
    print(f"estimated: {checks:.0f} case-checks of world sizes {sizes} in {total:.0f}s one world size after "
          f"another = {checks / total * 3600:.0f} case-checks per hour")


if __name__ == "__main__":
    main()
