"""Whether this platform's batched matrix products give a matrix the bits it gets alone.

A megabatched step and its members stepped alone run the same arithmetic only if the batched
products (torch.bmm, torch.baddbmm) compute each matrix of a stack of B x members exactly as in a
stack of B: then the `megabatch` relation must hold bitwise in fp64. BLAS libraries may pick their
kernel by the batch count. On GPUs cuBLAS does (harness/backends.py); on CPU so does torch 2.13's
(MKL) for some shapes: measured on one thread, fp64 products whose first factor is m x m with m odd
and >= 9 ([m, m] @ [m, m], [m, m] @ [m, n]; Dion2 selecting 9 of 12 rows orthogonalizes 9 x 20
matrices) differ in their last bits (~1e-15 relative) between a stack of 2 and a stack of 1;
with 2 threads more shapes do. No CI layer has such a shape for Muon; Dion2's selected submatrices
(k = ceil(fraction x slices) rows) can have any.

The probe runs the products of the Newton-Schulz family on the wide orientation [m, n] (m <= n):
X X^T, A A, baddbmm(A, A, A) and baddbmm(X, A, X), on random matrices, stacked as one megabatch and
per member, and compares them bitwise. Cached per (device, dtype, shape, stack sizes, threads).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from cases import Case
from harness.algorithms import algorithm
from harness.dtypes import TORCH_DTYPES
from harness.inputs import Inputs, f64
from oracles import Conventions


def _products(x: torch.Tensor, a: torch.Tensor) -> list[torch.Tensor]:
    """The Newton-Schulz family's products of stacks x [B, m, n] and symmetric a [B, m, m]."""
    return [torch.bmm(x, x.mT), torch.bmm(a, a), torch.baddbmm(a, a, a, beta=-4.775, alpha=2.0315),
            torch.baddbmm(x, a, x, beta=3.4445)]


@functools.cache
def _invariant(device: str, dtype: torch.dtype, batch: int, m: int, n: int, members: int, threads: int) -> bool:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(members * batch, m, n, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
    a = torch.bmm(x, x.mT)
    together = _products(x, a)
    alone = [_products(x[i * batch:(i + 1) * batch], a[i * batch:(i + 1) * batch]) for i in range(members)]
    return all(torch.equal(whole, torch.cat([one[j] for one in alone]))
               for j, whole in enumerate(together))


def batched_products_invariant(device: torch.device | str, dtype: torch.dtype, batch: int, m: int, n: int,
                               members: int) -> bool:
    """True if the products of `members` stacks of `batch` [m, n] matrices, stacked together, equal
    bitwise those of each stack alone here (this device, dtype and torch's thread count)."""
    m, n = min(m, n), max(m, n)
    return _invariant(str(device), dtype, batch, m, n, members, torch.get_num_threads())


def megabatch_variant_shapes(case: Case, conv: Conventions, inputs: Inputs) -> list[tuple[int, int]]:
    """The shapes [m, n] of the matrices `case`'s reference orthogonalizes (the algorithm's directions,
    harness/algorithms.py) whose batched products here depend on the megabatch size; [] when none."""
    directions = algorithm(case).directions(case, conv)
    shapes = set()
    for i in range(len(inputs.params)):
        state = directions.initial
        for step in inputs.grads:
            state, mats = directions.step(state, f64(step[i]))
            shapes |= {np.shape(stack) for stack in (mats if isinstance(mats, list) else [mats])}
    device, dtype = inputs.params[0].device, TORCH_DTYPES[conv.compute_dtype]
    return sorted((m, n) for b, m, n in shapes
                  if not batched_products_invariant(device, dtype, b, m, n, len(inputs.params)))
