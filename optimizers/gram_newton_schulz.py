"""Gram Newton–Schulz: the polynomial iteration run on the small Gram matrix.

A polynomial step X <- p(X Xᵀ) X with p(R) = aI + bR + cR² (wide X, m <= n) keeps X = Q X0
with Q a polynomial in R0 = X0 X0ᵀ, so the iteration can run on the m x m matrices alone:

  Z = bR + cR²;   Q <- Q (aI + Z);   R <- (aI + Z) R (aI + Z)

and only the last step touches the rectangular X again (X = Q X0). That costs O(m² n) for the
two products with X0 and O(m³) per step, instead of O(m² n) per step (Dao AI Lab, "Gram
Newton-Schulz", 2026; DeepSpeed 0.19.8 made it its default). In exact arithmetic it equals the
standard iteration, so its oracle is the same spectral map.

In half precision R accumulates rounding that shows up as spurious negative eigenvalues, which
the polynomials amplify; a *restart* before step i re-forms X = Q X and R = X Xᵀ from scratch.
The published versions compute in fp16 and restart before step 2 (`RESTARTS`); asked for bf16, ours
iterates in fp16 too (`iteration_dtype`): bf16's 8 significant bits are not enough for the Gram form
(see `HALF_ITERATES`). Square matrices take the standard iteration (no FLOP advantage), as the
published versions do. A result that is not finite, or whose Frobenius norm exceeds `DIVERGED` times
the largest one a converging schedule can give, is recomputed with the standard iteration in the
requested compute dtype: the optimizer's `stats` count those (`fallbacks`, optimizers/counters.py), and its
first one warns (RuntimeWarning).
"""

from __future__ import annotations

import contextlib
import functools
import types
import warnings
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from optimizers import counters, elementwise
from optimizers.kernels import TORCH, Kernels
from optimizers.norms import denominator, entry_limit, norm_limit, scale_of, scaled_and_cast
from optimizers.symmetric import (adds_identity, polynomial_product, polynomial_with_identity, symmetric_baddbmm,
                                  symmetric_bmm)

Coefficients = tuple[float, float, float]

RESTARTS: tuple[int, ...] = (2,)
"""Restart before step 2: gram-newton-schulz 0.1.6 (`gram_newton_schulz_reset_iterations=[2]`)
and DeepSpeed 0.19.8 (`restart_at = 2`)."""

HALF_ITERATES = types.MappingProxyType({torch.bfloat16: torch.float16})
"""Compute dtypes whose Gram iteration runs in another: bf16 runs in fp16, as gram-newton-schulz 0.1.6
(always fp16) and DeepSpeed 0.19.8 (`ns_compute_dtype("gram")`: fp16 "for better precision than bf16")
do. The Gram form is not backward stable the way the standard one is: Q = p(R) is formed from the
rounded R and applied to the rounded X0, and each rounding of R (u ||R||) mixes the large singular
directions into the small eigenspace of R, which the first two Polar Express steps amplify ~33x
(a0 a1); re-forming X = Q X0 at the restart carries that mixture. In bf16 (u = 2^-8) it reaches the
large singular values themselves: on the direction of `muon/conv1d-8x4x5/mb1/noflat/fp32@bf16/gns/
none/plain/wd0.1/steps3/lowrank/seed1` (step 2, matrix 5; singular values 1, 0.22, 0.008, 0.002)
bf16 returned -0.20 along the largest, where the map gives 0.94 (fp16: 0.91), with ||X||_F 1.5
sqrt(m), inside the divergence test. Over 200 such low-rank 4 x 5 momenta the worst error of a
resolved singular value was 1.78 in bf16, 0.09 in fp16 (the standard iteration in bf16: 0.50);
8 x 12: 1.26 against 0.07. After normalisation every entry of X lies in [-1, 1] and fp16's range
holds the iteration; an overflow (inf/nan) is caught as a divergence and recomputed in the requested
dtype."""


def iteration_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    """The dtype the Gram iteration runs in when `compute_dtype` is asked for (HALF_ITERATES)."""
    return HALF_ITERATES.get(compute_dtype, compute_dtype)


DIVERGED = 2.0
"""A result counts as diverged when ||X||_F > DIVERGED * sqrt(m): every singular value of a
converging schedule's result lies below ~1.2 (Keller Jordan's quintic peaks near 1.13), so an
honest result has ||X||_F < 1.2 sqrt(m)."""


@dataclass
class DeferredChecks:
    """The divergence checks of Gram results computed inside `deferred_checks()` (a CUDA-graph capture,
    or an eager megabatch whose flag is read later): one device flag per call, true when any of its
    matrices diverged, and how many matrices the calls computed. Whoever reads the flags (`read_flags`,
    `FlagCopy`) recomputes the whole update eagerly, where the fallback runs, if one is true."""

    flags: list[torch.Tensor] = field(default_factory=list)
    matrices: int = 0

    def any(self) -> torch.Tensor:
        """One device flag: true when any of the calls' matrices diverged (some flag was recorded)."""
        return torch.stack(self.flags).any()


_DEFERRED: ContextVar[DeferredChecks | None] = ContextVar("optimizers.gram_newton_schulz.deferred", default=None)
"""The innermost `deferred_checks` of this thread and context."""


@contextlib.contextmanager
def deferred_checks() -> Iterator[DeferredChecks]:
    """Within: gram_newton_schulz records its divergence flags here instead of reading them (no host
    synchronisation, no fallback, nothing counted: whoever reads the flags counts)."""
    checks = DeferredChecks()
    token = _DEFERRED.set(checks)
    try:
        yield checks
    finally:
        _DEFERRED.reset(token)


def read_flags(checks: Sequence[DeferredChecks]) -> list[bool]:
    """For each of `checks`: whether any of its results diverged (False where it recorded no flag), read
    in one host synchronisation."""
    flagged = [i for i, c in enumerate(checks) if c.flags]
    out = [False] * len(checks)
    if flagged:
        read = torch.stack([checks[i].any() for i in flagged]).tolist()
        for i, diverged in zip(flagged, read):
            out[i] = diverged
    return out


class FlagCopy:
    """Whether any result of `checks` diverged: reduced on the device and copied to pinned host memory as
    soon as it is made, so that `diverged()` waits for the kernels queued before it and for nothing queued
    after (a flag read with `bool` or `tolist` later would wait for all of them)."""

    def __init__(self, checks: DeferredChecks) -> None:
        flag = checks.any()
        self._event: torch.cuda.Event | None = None
        self._host = flag
        if flag.is_cuda:
            self._host = torch.empty((), dtype=torch.bool, pin_memory=True)
            self._host.copy_(flag, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()

    def diverged(self) -> bool:
        if self._event is not None:
            self._event.synchronize()
        return bool(self._host)


def takes_gram_iteration(rows: int, cols: int) -> bool:
    """True when a matrix of this shape takes the Gram iteration, whose result is checked for divergence
    on the host: a wide or tall one (square matrices take the standard iteration, as published)."""
    return rows != cols


def normalised(x: torch.Tensor, scale: float, eps: float, compute_dtype: torch.dtype,
               norms: torch.Tensor | None = None, kernels: Kernels = TORCH) -> torch.Tensor:
    """X / (scale ||X||_F + eps) per matrix, formed in at least fp32 and then rounded to
    `compute_dtype`: an fp16 cast before normalising would overflow gradients above 65504. `norms`: the
    norms [B], already known, in at least x's precision (else formed here); `kernels`: optimizers/kernels.py.
    A matrix whose entries (or known norm) could overflow the norm is scaled down by a power of two first
    (optimizers/norms.py)."""
    wide = torch.promote_types(x.dtype, torch.float32)
    if norms is None:
        limit = entry_limit(x.size(-2) * x.size(-1), wide, scale)
        x, norm, power = scaled_and_cast(x, (-2, -1), limit, wide, kernels)
    else:
        known = norms.view(-1, 1, 1)
        power = scale_of(known, norm_limit(wide, scale))
        divisor = denominator((known * power).to(wide), scale, eps, power)
        # x power / divisor in one pass where the kernel runs (the bits of the two passes below)
        fused = None if compute_dtype == wide else elementwise.divide(x, divisor, compute_dtype, kernels, power)
        if fused is not None:
            return fused
        x = torch.mul(x, power, out=torch.empty_like(x, dtype=wide))
        return normalised_by(x, divisor, compute_dtype, kernels)
    return normalised_by(x, denominator(norm, scale, eps, power), compute_dtype, kernels)


def normalised_by(x: torch.Tensor, divisor: torch.Tensor, compute_dtype: torch.dtype, kernels: Kernels) -> torch.Tensor:
    """x / divisor (the divisor in x's dtype), rounded to `compute_dtype`: in one
    pass, the quotient formed in at least fp32 and rounded to `compute_dtype` as it is written (the bits of
    dividing, then casting), in x's memory layout; where `kernels` allow, by the fused kernel (the same bits)."""
    fused = elementwise.divide(x, divisor, compute_dtype, kernels)
    if fused is not None:
        return fused
    if compute_dtype == x.dtype:
        return x / divisor
    return torch.div(x, divisor, out=torch.empty_like(x, dtype=compute_dtype))


def standard_steps(x: torch.Tensor, coefficients: Sequence[Coefficients], kernels: Kernels = TORCH) -> torch.Tensor:
    """The standard iteration X <- (aI + bA + cA²)X, A = X Xᵀ, on wide matrices x [B, m, n]
    (A and the polynomial by their lower block triangles or the Triton kernel, optimizers/symmetric.py)."""
    for a, b, c in coefficients:
        gram = symmetric_bmm(x, x.mT, kernels=kernels)
        x = polynomial_product(gram, x, a, b, c, kernels)
    return x


def gram_steps(x: torch.Tensor, coefficients: Sequence[Coefficients], restarts: Sequence[int],
               kernels: Kernels = TORCH) -> torch.Tensor:
    """The Gram iteration on wide matrices x [B, m, n] (m < n), restarting before each step in `restarts`.

    R, Z, Q and the products updating them are polynomials in one symmetric matrix (they commute), so
    each is symmetric and formed by its lower block triangle (optimizers/symmetric.py). Where `kernels` let the
    Triton kernel take the products (`adds_identity`), it forms W = aI + Z in one rounding and the updates are
    plain products, Q W and (R W) W; elsewhere Q Z + aQ, R Z + aR, as the published versions round them."""
    r = symmetric_bmm(x, x.mT, kernels=kernels)
    q: torch.Tensor | None = None
    last = len(coefficients) - 1
    fused = adds_identity(r, kernels)
    for i, (a, b, c) in enumerate(coefficients):
        if i in restarts and q is not None:
            x = q @ x
            r = symmetric_bmm(x, x.mT, kernels=kernels)
            q = None
        update_r = i < last and i + 1 not in restarts
        if fused:
            w = polynomial_with_identity(r, a, b, c, kernels)
            q = w if q is None else symmetric_bmm(q, w, kernels=kernels)
            if update_r:
                r = symmetric_bmm(symmetric_bmm(r, w, kernels=kernels), w, kernels=kernels)
            continue
        z = symmetric_baddbmm(r, r, r, beta=b, alpha=c, kernels=kernels)
        q = plus_identity(z, a) if q is None else symmetric_baddbmm(q, q, z, beta=a, kernels=kernels)
        if update_r:
            rz = symmetric_baddbmm(r, z, r, beta=a, kernels=kernels)
            r = symmetric_baddbmm(rz, z, rz, beta=a, kernels=kernels)
    return x if q is None else q @ x


def plus_identity(z: torch.Tensor, a: float) -> torch.Tensor:
    """z + a I for a stack z [B, m, m], as `z + a * torch.eye(m)` rounds it (a rounded to z's dtype through
    the fp32 arithmetic of half types first), by a copy and a diagonal add: no identity matrix formed."""
    out = z.clone(memory_format=torch.contiguous_format)
    out.diagonal(dim1=-2, dim2=-1).add_(_rounded(a, z.dtype))
    return out


@functools.lru_cache(maxsize=256)
def _rounded(a: float, dtype: torch.dtype) -> float:
    """a rounded to `dtype` as a tensor-by-scalar product of that dtype rounds it (half types through fp32)."""
    return torch.tensor(a, dtype=torch.promote_types(dtype, torch.float32)).to(dtype).item()


def gram_newton_schulz(x: torch.Tensor, coefficients: Sequence[Coefficients], scale: float, eps: float,
                       compute_dtype: torch.dtype, restarts: Sequence[int] = RESTARTS,
                       out_dtype: torch.dtype | None = None, norms: torch.Tensor | None = None,
                       kernels: Kernels = TORCH) -> torch.Tensor:
    """orth(x) for a stack x [B, m, n] by Gram Newton–Schulz in `compute_dtype` (the iteration itself in
    `iteration_dtype(compute_dtype)`), returned in `out_dtype` (default x's dtype).

    `coefficients`: one (a, b, c) per step; `scale`, `eps`: the normaliser scale ||X||_F + eps;
    `restarts`: steps before which X and R are re-formed (0 and indices past the schedule do nothing);
    `norms`: the Frobenius norms [B] of x's matrices, already known (`normalised`); `kernels`: the Triton
    kernels it may take (optimizers/kernels.py). Matrices of the Gram iteration and divergence fallbacks are
    counted in the current counting scope (optimizers/counters.py); the first fallback of a scope (or any
    outside one) warns.
    """
    if x.ndim != 3:
        raise ValueError(f"expected a stack of matrices [B, m, n], got shape {tuple(x.shape)}")
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in restarts):
        raise ValueError(f"restarts must be non-negative step indices, got {tuple(restarts)}")
    tall = x.size(-2) > x.size(-1)
    oriented = x.mT if tall else x
    m, n = oriented.shape[-2:]
    if not takes_gram_iteration(m, n) or oriented.numel() == 0:
        out = standard_steps(normalised(oriented, scale, eps, compute_dtype, norms, kernels), coefficients, kernels)
    else:
        out = gram_steps(normalised(oriented, scale, eps, iteration_dtype(compute_dtype), norms, kernels),
                         coefficients, restarts, kernels)
        sizes = torch.linalg.vector_norm(out, dim=(-2, -1), dtype=torch.promote_types(out.dtype, torch.float32))
        # not (finite and <= the bound), in one comparison: NaN compares false, +inf exceeds the bound
        bad = sizes.le(DIVERGED * m**0.5).logical_not_()
        deferred = _DEFERRED.get()
        if deferred is not None:
            deferred.flags.append(bad.any())
            deferred.matrices += out.size(0)
            return as_dtype(out.mT if tall else out, out_dtype or x.dtype)
        stats = counters.current()
        if stats is not None:
            stats.gram += out.size(0)
        if bool(bad.any()):
            out = out.to(torch.promote_types(out.dtype, compute_dtype), copy=True)  # fp16 and bf16: fp32
            again = normalised(oriented[bad], scale, eps, compute_dtype, None if norms is None else norms[bad],
                               kernels)
            out[bad] = standard_steps(again, coefficients, kernels).to(out.dtype)
            fallback(int(bad.sum()), stats)
    return as_dtype(out.mT if tall else out, out_dtype or x.dtype)


def fallback(count: int, stats: counters.Stats | None) -> None:
    """Count `count` diverged results recomputed by the standard iteration in `stats`; warn at the first of
    `stats` (or at any, outside a counting scope): a fallback changes the arithmetic of the step."""
    if stats is None or stats.fallbacks == 0:
        warnings.warn(f"Gram Newton-Schulz: {count} result(s) diverged (not finite, or ||X||_F above "
                      f"{DIVERGED} sqrt(m)) and were recomputed by the standard iteration; an optimizer counts "
                      f"them in its stats.fallbacks (this warning: its first)", RuntimeWarning, stacklevel=2)
    if stats is not None:
        stats.fallbacks += count


def as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`t` in `dtype`: as it is when it has it, else cast into a contiguous tensor (a tall matrix's result,
    computed as its transpose, comes back row-major as its parameter lies, in the same one pass, so the
    update is applied with coalesced reads)."""
    return t if t.dtype == dtype else t.to(dtype, memory_format=torch.contiguous_format)
