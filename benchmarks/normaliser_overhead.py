"""What the overflow-safe normaliser (optimizers/norms.py) costs on CPU: the polynomial orthogonalizers'
X / (factor ||X||_F + eps), unscaled (cast, norm, divide: not overflow-safe), always scaled (max |entry|,
power-of-two scale, multiply, norm, divide: what runs off CPU) and as it runs on CPU (`scaled_and_cast`:
cast and norm, the largest-entry pass only where a norm exceeds the limit), beside the whole
orthogonalization (Polar Express, 5 steps). "added" is each safe form's time over the unscaled one.

Process CPU time of each, the minimum over --reps runs taken in turns (so that a loaded, shared machine
slows both alike), one thread.

  python benchmarks/normaliser_overhead.py [--reps 40]
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import torch

from optimizers.coefficients import normaliser_scale
from optimizers.norms import denominator, downscale, entry_limit, frobenius, scaled_and_cast
from optimizers.orthogonalize import orthogonalize

STACKS = ((200, 12, 20), (200, 64, 64), (16, 256, 512), (4, 512, 1024))
FACTOR = normaliser_scale("polar_express")


def unscaled(x: torch.Tensor) -> torch.Tensor:
    x = x.to(torch.float32)
    return x / (frobenius(x, (-2, -1), keepdim=True) * FACTOR + 1e-7)


def scaled(x: torch.Tensor) -> torch.Tensor:
    scale = downscale(x, (-2, -1), entry_limit(x.size(-2) * x.size(-1), torch.float32, FACTOR))
    x = torch.mul(x, scale, out=torch.empty_like(x, dtype=torch.float32))
    return x / denominator(frobenius(x, (-2, -1), keepdim=True), FACTOR, 1e-7, scale)


def shortcut(x: torch.Tensor) -> torch.Tensor:
    limit = entry_limit(x.size(-2) * x.size(-1), torch.float32, FACTOR)
    x, norm, scale = scaled_and_cast(x, (-2, -1), limit, torch.float32)
    return x / denominator(norm, FACTOR, 1e-7, scale)


def cpu_seconds(run: Callable[[], object]) -> float:
    start = time.process_time()
    run()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'stack':<18} {'unscaled':>10} {'scaled':>10} {'cpu form':>10} {'orthogonalize':>14} "
          f"{'scaled added/orth':>18} {'cpu form added/orth':>20}")
    for shape in STACKS:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        runs = {"unscaled": lambda: unscaled(x), "scaled": lambda: scaled(x), "cpu": lambda: shortcut(x),
                "orth": lambda: orthogonalize(x, "polar_express", 5, 1e-7, torch.float32)}
        best = {name: float("inf") for name in runs}
        for _ in range(args.reps):
            for name, run in runs.items():
                best[name] = min(best[name], cpu_seconds(run))
        added = {name: (best[name] - best["unscaled"]) / best["orth"] for name in ("scaled", "cpu")}
        print(f"{'x'.join(map(str, shape)):<18} {best['unscaled'] * 1e3:8.3f}ms {best['scaled'] * 1e3:8.3f}ms "
              f"{best['cpu'] * 1e3:8.3f}ms {best['orth'] * 1e3:12.3f}ms {added['scaled']:18.1%} "
              f"{added['cpu']:20.1%}", flush=True)


if __name__ == "__main__":
    main()
