"""Host time of one `Muon.step()` with many small parameters (CPU, one process).

Builds `--params` parameters of `--shape` (fp32) in one Muon group, gives each a gradient, and prints the median and minimum wall time of `--steps` steps after two
warm-up steps. The batched orthogonalization dominates a CPU step and is the same work before
and after any host-side change, so it is timed alone and, with `--host-only`, replaced by a
pass-through (every module of the package that imported `orthogonalize` gets the stub): what
is left is the host overhead of the step (validation, bucketing, momentum, stacking, apply).

  python benchmarks/step_overhead.py [--params 200] [--shape 64 64] [--steps 20] [--threads 1] [--host-only]
                                     [--no-cache]

`--no-cache` drops the validated plan before every step (Muon re-validates everything, as it did
before plans were cached); the plan alone (`Muon._plan`, cached and not) is timed too.

`--root DIR` imports `optimizers` from DIR instead (to time another checkout of the package).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable


def _pass_through(x, *args):
    return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=200)
    parser.add_argument("--shape", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--root", default=None)
    parser.add_argument("--host-only", action="store_true")
    parser.add_argument("--no-cache", action="store_true")
    args = parser.parse_args()
    if args.root:
        sys.path.insert(0, args.root)
    import torch
    import optimizers
    from optimizers.orthogonalize import orthogonalize

    torch.set_num_threads(args.threads)
    if args.host_only:
        for name, module in list(sys.modules.items()):
            if name.startswith("optimizers") and getattr(module, "orthogonalize", None) is orthogonalize:
                module.orthogonalize = _pass_through
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*args.shape, generator=g)) for _ in range(args.params)]
    grads = [torch.randn(*args.shape, generator=g) for _ in params]
    for p, grad in zip(params, grads):
        p.grad = grad  # Muon never writes a gradient: the same ones serve every step
    opt = optimizers.Muon(params, lr=0.02)

    stack = torch.stack(grads).reshape(args.params, args.shape[0], -1)
    print(f"optimizers from {optimizers.__file__}")
    print(f"{args.params} params of {tuple(args.shape)} fp32, {args.threads} thread(s), {args.steps} steps"
          f"{', orthogonalization stubbed (host only)' if args.host_only else ''}")
    planned = hasattr(opt, "_plan")

    def step() -> None:
        if args.no_cache and planned:
            opt._cached = None
        opt.step()

    def uncached_plan() -> None:
        opt._cached = None
        opt._plan()

    _report("step()", _timed(step, args.steps))
    if planned:
        _report("plan (cached)", _timed(opt._plan, args.steps))
        _report("plan (checks)", _timed(uncached_plan, args.steps))
    if not args.host_only:
        _report("orthogonalize", _timed(lambda: orthogonalize(stack, "polar_express", 5, 1e-7, torch.float32),
                                        args.steps))


def _timed(run: Callable[[], None], steps: int) -> tuple[list[float], list[float]]:
    """Wall and CPU (process) seconds of each of `steps` calls after two warm-up calls. CPU time
    is what to compare on a shared machine: other processes inflate wall time, not it."""
    wall, cpu = [], []
    for k in range(steps + 2):
        w, c = time.perf_counter(), time.process_time()
        run()
        if k >= 2:
            wall.append(time.perf_counter() - w)
            cpu.append(time.process_time() - c)
    return wall, cpu


def _report(what: str, times: tuple[list[float], list[float]]) -> None:
    wall, cpu = times
    print(f"{what:14s} wall median {statistics.median(wall) * 1e3:8.2f} ms   "
          f"cpu median {statistics.median(cpu) * 1e3:8.2f} ms   cpu min {min(cpu) * 1e3:8.2f} ms")

if __name__ == "__main__":
    main()
