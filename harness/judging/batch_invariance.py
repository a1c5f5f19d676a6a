"""Whether this platform's batched matrix products give a matrix the bits it gets alone.

A megabatched step and its members stepped alone run the same arithmetic only if the batched
products (torch.bmm, torch.baddbmm) compute each matrix of a stack of B x members exactly as in a
stack of B: then the `megabatch` relation must hold bitwise in fp64. BLAS libraries may pick their
kernel by the batch count. On GPUs cuBLAS does (harness/running/backends.py); on CPU so does torch 2.13's
(MKL) for some shapes: measured on one thread, fp64 products whose first factor is m x m with m odd
and >= 9 ([m, m] @ [m, m], [m, m] @ [m, n]; Dion2 selecting 9 of 12 rows orthogonalizes 9 x 20
matrices) differ in their last bits (~1e-15 relative) between a stack of 2 and a stack of 1;
with 2 threads more shapes do. No CI layer has such a shape for Muon; Dion2's selected submatrices
(k = ceil(fraction x slices) rows) can have any.

The probe runs two Newton-Schulz steps as the family forms them (a tall stack on its transposed
view, normalised, then X X^T, bA + cA^2 and aX + (bA + cA^2) X by torch.bmm / torch.baddbmm) on random
matrices of the shapes the case orthogonalizes, stacked as one megabatch and per member, and compares
them bitwise: the layout matters too (Dion2 keeping 5 of linear_tall's 6 columns orthogonalizes 24 x 5
stacks through their transposed view, not invariant here, where contiguous 5 x 24 stacks are).
Cached per (device, dtype, shape, stack sizes, threads).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from cases import Case
from harness.algorithms import algorithm
from harness.running.inputs import TORCH_DTYPES, Inputs, f64
from oracles import Conventions


def _iteration(x: torch.Tensor) -> torch.Tensor:
    """Two Newton-Schulz steps on a stack x [B, r, c] as the family forms them: on the wide orientation
    (a tall stack as its transposed view, r > c), normalised, X <- aX + (bA + cA^2) X with A = X X^T."""
    wide = x.mT if x.size(-2) > x.size(-1) else x
    wide = wide / (torch.linalg.matrix_norm(wide, keepdim=True) + 1e-7)
    for _ in range(2):
        gram = torch.bmm(wide, wide.mT)
        wide = torch.baddbmm(wide, torch.baddbmm(gram, gram, gram, beta=-4.775, alpha=2.0315), wide, beta=3.4445)
    return wide


@functools.cache
def _invariant(device: str, dtype: torch.dtype, batch: int, r: int, c: int, members: int, threads: int) -> bool:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(members * batch, r, c, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
    together = _iteration(x)
    alone = torch.cat([_iteration(x[i * batch:(i + 1) * batch]) for i in range(members)])
    return torch.equal(together, alone)


def batched_products_invariant(device: torch.device | str, dtype: torch.dtype, batch: int, r: int, c: int,
                               members: int) -> bool:
    """True if Newton-Schulz steps on `members` stacks of `batch` [r, c] matrices, stacked together, equal
    bitwise those on each stack alone here (this device, dtype and torch's thread count)."""
    return _invariant(str(device), dtype, batch, r, c, members, torch.get_num_threads())


def megabatch_variant_shapes(case: Case, conv: Conventions, inputs: Inputs,
                             copies: int | None = None) -> list[tuple[int, int]]:
    """The shapes [m, n] of the matrices `case`'s reference orthogonalizes (the algorithm's directions,
    harness/algorithms.py) whose batched products here depend on the megabatch size, in either
    orientation (a target may stack them as [m, n] or [n, m]: the oracle holds Dion2's selected columns
    as rows, ours as columns); [] when none. By default the megabatch against each member alone; with
    `copies`, `copies` megabatches stacked as one (a group holding the megabatch and its twins) against
    the megabatch alone."""
    directions = algorithm(case).directions(case, conv)
    shapes = set()
    for i in range(len(inputs.params)):
        state = directions.initial
        for step in inputs.grads:
            state, mats = directions.step(state, f64(step[i]))
            shapes |= {np.shape(stack) for stack in (mats if isinstance(mats, list) else [mats])}
    device, dtype = inputs.params[0].device, TORCH_DTYPES[conv.compute_dtype]
    members = len(inputs.params)
    if copies is None:
        invariant = lambda b, r, c: batched_products_invariant(device, dtype, b, r, c, members)
    else:
        invariant = lambda b, r, c: batched_products_invariant(device, dtype, b * members, r, c, copies)
    return sorted((m, n) for b, m, n in shapes if not (invariant(b, m, n) and invariant(b, n, m)))
