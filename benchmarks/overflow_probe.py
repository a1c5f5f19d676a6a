"""The smallest gradient scale at which an optimizer's update goes wrong, per parameter and compute dtype.

An orthogonalized update is invariant under scaling the gradient (up to eps, negligible here), so one step
from X = 0 with lr 1 and the gradient 2^k G must give the update of G itself. For k = 1, 2, ... up to the
largest k with 2^k G finite in the parameter's dtype (STRIDE), this takes one such step and prints the
smallest 2^k whose update is not finite, zero, or off G's by more than TOLERANCE (relative, Frobenius);
"none" where every such 2^k G steps right. A normaliser that overflows gives 0 or NaN. torch.optim.Muon
(computes in bf16 whatever the parameter's dtype) against ours, each algorithm and orthogonalizer. CPU.

  python benchmarks/overflow_probe.py [--shape 64 256]
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

import torch

import optimizers

TOLERANCE = 1e-2
"""Relative distance from the update of the unscaled gradient that counts as wrong (an exact power of two
scaling leaves every correct implementation's update within a few rounding errors of it)."""

PAIRS = ((torch.float32, torch.float32), (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32),
         (torch.float64, torch.float64), (torch.float64, torch.float32))
"""(parameter dtype, compute dtype) pairs probed for ours; torch.optim.Muon computes in bf16 always."""

Make = Callable[[list[torch.Tensor], torch.dtype], torch.optim.Optimizer]


def ours(algorithm: type, **options) -> Make:
    return lambda params, compute: algorithm(params, lr=1.0, compute_dtype=compute, **options)


TARGETS: dict[str, Make] = {
    "torch.optim.Muon": lambda params, compute: torch.optim.Muon(params, lr=1.0, nesterov=False),
    "ours muon polar_express": ours(optimizers.Muon),
    "ours muon newton_schulz": ours(optimizers.Muon, orthogonalizer="newton_schulz"),
    "ours muon gram_newton_schulz": ours(optimizers.Muon, orthogonalizer="gram_newton_schulz"),
    "ours muon svd": ours(optimizers.Muon, orthogonalizer="svd"),
    "ours normuon": ours(optimizers.NorMuon),
    "ours dion2": ours(optimizers.Dion2, fraction=0.5),
    "ours nordion2": ours(optimizers.NorDion2, fraction=0.5),
}


def update(make: Make, grad: torch.Tensor, compute: torch.dtype) -> torch.Tensor:
    """-(X after one step from X = 0 with lr 1), in fp64."""
    p = torch.nn.Parameter(torch.zeros_like(grad))
    opt = make([p], compute)
    p.grad = grad
    opt.step()
    return -p.detach().double()


def top_scale(g: torch.Tensor) -> int:
    """The largest k with 2^k g finite in g's dtype."""
    return math.frexp(torch.finfo(g.dtype).max)[1] - math.frexp(g.abs().max().item())[1]


STRIDE = 4
"""Scales are tried at every STRIDE-th power of two, then one by one below the first wrong one (a wrong
range narrower than STRIDE between two right scales would go unseen)."""


def wrong(make: Make, g: torch.Tensor, k: int, want: torch.Tensor, compute: torch.dtype) -> str | None:
    """How the update of 2^k g is wrong (None: it is right)."""
    got = update(make, g * 2.0**k, compute)
    if not torch.isfinite(got).all():
        return "not finite"
    if not got.any():
        return "zero"
    off = ((got - want).norm() / want.norm()).item()
    return f"{off:.2g} off" if off > TOLERANCE else None


def first_wrong(make: Make, g: torch.Tensor, compute: torch.dtype) -> tuple[int, str] | None:
    """(k, what) of the smallest 2^k whose update is wrong, or None where none is up to `top_scale(g)`."""
    want, top = update(make, g, compute), top_scale(g)
    right = 0
    for coarse in [*range(STRIDE, top, STRIDE), top]:
        if wrong(make, g, coarse, want, compute) is None:
            right = coarse
            continue
        for k in range(right + 1, coarse + 1):
            what = wrong(make, g, k, want, compute)
            if what is not None:
                return k, what
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=int, nargs=2, default=(64, 256), metavar=("ROWS", "COLS"))
    args = parser.parse_args()
    base = torch.randn(*args.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    print(f"gradient: a {args.shape[0]} x {args.shape[1]} Gaussian times 2^k; wrong: the update not finite, "
          f"zero, or > {TOLERANCE:g} off the unscaled gradient's (relative)")
    print(f"{'target':<30} {'param':<9} {'compute':<9} first wrong scale")
    for name, make in TARGETS.items():
        pairs = sorted({(p, torch.bfloat16) for p, _ in PAIRS}, key=str) if name.startswith("torch") else PAIRS
        for dtype, compute in pairs:
            g = base.to(dtype)
            found, top = first_wrong(make, g, compute), top_scale(g)
            verdict = (f"none up to 2^{top} (~1e{top * math.log10(2):.0f})" if found is None else
                       f"2^{found[0]} (~1e{found[0] * math.log10(2):.1f}): {found[1]}")
            print(f"{name:<30} {str(dtype)[6:]:<9} {str(compute)[6:]:<9} {verdict}", flush=True)


if __name__ == "__main__":
    main()
