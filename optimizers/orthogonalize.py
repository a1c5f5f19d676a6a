"""Batched orthogonalization of a stack of matrices [B, m, n] in torch.

Polynomial methods run X <- aX + (bA + cA^2) X with A = X X^T on the wide
orientation (tall inputs are transposed, which leaves the odd polynomial's result
unchanged and costs fewer flops); the symmetric A and bA + cA^2 of large matrices are
formed by their lower block triangles (optimizers/symmetric.py). "gram_newton_schulz" runs the same polynomials on
the Gram matrix (optimizers/gram_newton_schulz.py) with a coefficient schedule of its
choice ("polar_express" by default, or "newton_schulz"). "svd" returns the polar factor
U V^T over the singular values above max(m, n) * eps * s_max.
"""

from __future__ import annotations

import math

import torch

from typing import Sequence

from optimizers import gram_newton_schulz as gram
from optimizers.coefficients import normaliser_scale, schedule
from optimizers.kernels import TORCH, Kernels
from optimizers.norms import denominator, downscale, entry_limit, norm_limit, scaled_and_cast

ORTHOGONALIZERS = ("newton_schulz", "polar_express", "svd", "gram_newton_schulz")
SCHEDULES = ("polar_express", "newton_schulz")
"""Coefficient schedules Gram Newton-Schulz can run (`ns_coefficients`); the default is the first."""


def polynomial(x: torch.Tensor, name: str, steps: int, eps: float, compute_dtype: torch.dtype,
               kernels: Kernels = TORCH) -> torch.Tensor:
    """Run orthogonalizer `name` for `steps` on every matrix of x [B, m, n], in `compute_dtype`: from
    X0 = X / (factor ||X||_F + eps), X rounded to `compute_dtype` (a matrix whose entries could overflow
    the norm, or that cast, scaled down first by a power of two: optimizers/norms.py). `kernels`: the
    Triton kernels it may take (optimizers/kernels.py)."""
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    factor = normaliser_scale(name)
    limit = entry_limit(x.size(-2) * x.size(-1), compute_dtype, factor)
    x, norm, scale = scaled_and_cast(x, (-2, -1), limit, compute_dtype, kernels)
    x = gram.normalised_by(x, denominator(norm, factor, eps, scale), compute_dtype, kernels)
    x = gram.standard_steps(x, schedule(name, steps), kernels)
    return x.mT if tall else x


def polar_via_svd(x: torch.Tensor) -> torch.Tensor:
    """U V^T of every matrix of x [B, m, n] over its numerically nonzero singular values; NaN for a
    matrix with a value that is not finite (which LAPACK refuses: optimizers/algorithms/base.py)."""
    finite = x.isfinite().flatten(-2).all(-1)[:, None, None]
    u, s, vh = torch.linalg.svd(torch.where(finite, x, 0.0), full_matrices=False)
    cutoff = max(x.shape[-2:]) * torch.finfo(x.dtype).eps * s[..., :1]
    keep = (s > cutoff).to(x.dtype)
    return torch.where(finite, (u * keep.unsqueeze(-2)) @ vh, math.nan)


def orthogonalize(x: torch.Tensor, name: str, steps: int, eps: float, compute_dtype: torch.dtype,
                  coefficients: str | None = None, restarts: Sequence[int] = gram.RESTARTS,
                  out_dtype: torch.dtype | None = None, norms: torch.Tensor | None = None,
                  kernels: Kernels = TORCH) -> torch.Tensor:
    """orth(x) for a stack x [B, m, n], computed in `compute_dtype`, returned in `out_dtype` (default x's).

    `coefficients` and `restarts` apply to "gram_newton_schulz" only: its schedule (SCHEDULES) and the
    steps before which it re-forms X and R; divergences it recomputes are counted (optimizers/counters.py).
    So does `norms`: the Frobenius norms [B] of x's matrices, already known, in x's precision (at least fp32)
    or in fp64, which it divides by instead of forming its own (the other orthogonalizers form theirs in the
    compute dtype: ValueError). `kernels`: the Triton kernels the polynomial orthogonalizers may take
    (optimizers/kernels.py)."""
    out_dtype = out_dtype or x.dtype
    if name not in ORTHOGONALIZERS:
        raise ValueError(f"unknown orthogonalizer {name!r}; expected one of {ORTHOGONALIZERS}")
    if x.ndim != 3:
        raise ValueError(f"expected a stack of matrices [B, m, n], got shape {tuple(x.shape)}")
    if norms is not None:
        wide = torch.promote_types(x.dtype, torch.float32)
        if name != "gram_newton_schulz" or norms.shape != x.shape[:1] or norms.dtype not in (wide, torch.float64):
            raise ValueError(f"norms ({tuple(norms.shape)}, {norms.dtype}) are taken by gram_newton_schulz only, "
                             f"one per matrix in {wide} or fp64; got them for {name!r} on a stack {tuple(x.shape)}")
    if name == "gram_newton_schulz":
        coefficients = coefficients or SCHEDULES[0]
        return gram.gram_newton_schulz(x, schedule(coefficients, steps), normaliser_scale(coefficients), eps,
                                       compute_dtype, restarts, out_dtype, norms, kernels)
    if name == "svd":  # U V^T of X is that of X scale: scaled where the singular values (<= ||X||_F) could overflow
        svd_dtype = torch.float64 if compute_dtype == torch.float64 else torch.float32
        scale = downscale(x, (-2, -1), norm_limit(svd_dtype, math.sqrt(x.size(-2) * x.size(-1))))
        return gram.as_dtype(polar_via_svd(torch.mul(x, scale, out=torch.empty_like(x, dtype=svd_dtype))), out_dtype)
    return gram.as_dtype(polynomial(x, name, steps, eps, compute_dtype, kernels), out_dtype)
