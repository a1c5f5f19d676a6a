"""Amortized cost of a distributed case on the rank pool, against spawning ranks per case.

Both sides run the same rank-side work (harness.running.ranks.rank_trajectory: build the
layout, step our distributed Muon, send the pieces back) for the same distributed CI cases of one
world size on gloo, measured side by side in this process:

  pool    one RankPool started once, then fed every case; amortized = (start + all cases) / cases
  spawn   per case: spawn the ranks, rendezvous, run the case, shut down (what a suite without a
          pool does)

Prints per-case medians and the ratio. Usage: python benchmarks/pool_vs_spawn.py [--world-size 2]
[--cases 20] [--spawned 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from cases import ci_cases
from harness.running.pool import RankPool
from harness.running.ranks import rank_trajectory


def _timed_case(pool: RankPool, case_id: str) -> float:
    t0 = time.perf_counter()
    result = pool.run(rank_trajectory, case_id, "ours")
    if not result.ok:
        raise SystemExit(f"case {case_id} failed:\n{result.describe()}")
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--cases", type=int, default=20, help="cases fed to the pool")
    parser.add_argument("--spawned", type=int, default=5, help="cases run spawn-per-case (each costs a spawn)")
    args = parser.parse_args()
    ids = [c.id for c in ci_cases() if c.layout != "single" and c.world_size == args.world_size][:args.cases]
    print(f"{len(ids)} distributed CI cases, world size {args.world_size}, gloo", flush=True)

    t0 = time.perf_counter()
    pool = RankPool("gloo", args.world_size)
    start = time.perf_counter() - t0
    per_case = [_timed_case(pool, i) for i in ids]
    pool.close()
    amortized = (start + sum(per_case)) / len(per_case)
    print(f"pool:  start {start:.2f}s, then per case median {statistics.median(per_case) * 1e3:.1f} ms; "
          f"amortized over {len(ids)} cases {amortized * 1e3:.1f} ms/case", flush=True)

    spawned = []
    for case_id in ids[:args.spawned]:
        t0 = time.perf_counter()
        one = RankPool("gloo", args.world_size)
        _timed_case(one, case_id)
        one.close()
        spawned.append(time.perf_counter() - t0)
        print(f"  spawn-per-case: {spawned[-1]:.2f}s", flush=True)
    median_spawn = statistics.median(spawned)
    print(f"spawn: per case median {median_spawn * 1e3:.1f} ms over {len(spawned)} cases")
    print(f"pool amortized is {median_spawn / amortized:.1f}x cheaper per case "
          f"(warm pool per-case median: {median_spawn / statistics.median(per_case):.0f}x)")


if __name__ == "__main__":
    main()
