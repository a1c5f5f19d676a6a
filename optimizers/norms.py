"""The Frobenius norm our stages divide by, accurate on large CPU matrices too.

torch's CPU norm kernel accumulates fp32 (and half types, widened to fp32) in one fp32 accumulator per
vector lane, so its error grows with the count (pytorch/pytorch#169237, open). Measured with torch 2.13 on
Gaussian rows, the worst of 64, relative: 5.5e-7 at 36,864 elements (9 u), 7.0e-7 at 2^16, 1.2e-5 at 2^20,
8.6e-5 at 2^22, where torch.sum's cascade summation stays within 1.4e-7 at every count. Through the
normaliser that error moves the whole orthogonalized update: Polar Express in fp32 on a 2048 x 4608 Gaussian
matrix came out 4.9e-4 off the fp64 iteration (the harness's `gpu` tier flagged it at 26x its allowance).
So on CPU a norm over CASCADE_FROM elements or more is torch.sum's sum of squares; smaller ones (every CI and
nightly matrix: at most 36,864 elements, where the measured tolerance coefficients absorb torch's few u),
CUDA's tree reductions and fp64 keep torch's norm.

Overflow: the normaliser X / (factor ||X||_F + eps) squares every entry, so its sum of squares overflows
from entries of about sqrt(max / count) (fp32: 2^57 for 64 x 256; fp64: 2^505), and ||X||_F itself from
max / sqrt(count). LAPACK's nrm2 scales every vector; here a matrix is scaled only where its largest
|entry| exceeds `entry_limit`, below which nothing can overflow, and only by a power of two (`scale_of`),
so every other matrix keeps its bits exactly and a scaled one is exact but where an entry falls into the
subnormal range (far below the rounding of the norm).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from optimizers import elementwise
from optimizers.kernels import TORCH, Kernels

CASCADE_FROM = 1 << 16
"""Elements per norm from which the CPU norm is a cascade sum (torch's kernel is ~12 u off there, and grows)."""


def frobenius(x: torch.Tensor, dim: int | tuple[int, ...], keepdim: bool = False) -> torch.Tensor:
    """sqrt(sum of x² over `dim`), in x's dtype (half types summed in fp32)."""
    count = math.prod(x.shape[d] for d in ((dim,) if isinstance(dim, int) else dim))
    if x.device.type != "cpu" or x.dtype == torch.float64 or count < CASCADE_FROM:
        return torch.linalg.vector_norm(x, dim=dim, keepdim=keepdim)
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    return wide.square().sum(dim=dim, keepdim=keepdim).sqrt().to(x.dtype)


def largest_power_of_two(holds: Callable[[float], bool], estimate: float) -> float:
    """The largest power of two p with holds(p), for a `holds` true up to some bound and false beyond it, found
    from `estimate` (a float near that bound) by exact comparisons: math.log2 and math.sqrt round, and at the
    top of fp64's range their rounding put an estimate's power of two past the bound."""
    p = 2.0 ** math.floor(math.log2(estimate))
    while not holds(p):
        p /= 2
    while holds(2 * p):
        p *= 2
    return p


def norm_limit(dtype: torch.dtype, factor: float) -> float:
    """The largest power of two L with factor * L at most a quarter of `dtype`'s largest value: a norm up to
    L gives a normaliser denominator factor ||X|| + eps that does not overflow."""
    quarter = torch.finfo(dtype).max / 4
    return largest_power_of_two(lambda p: factor * p <= quarter, quarter / factor)


def entry_limit(count: int, dtype: torch.dtype, factor: float) -> float:
    """The largest power of two L such that no matrix of `count` entries of magnitude at most L, in `dtype`,
    overflows its normaliser: its norm stays within `norm_limit` and its sum of squares (summed in at least
    fp32, as `frobenius` and torch's half types sum) within a quarter of that sum's largest value (the
    quarters leave room for the sums' rounding)."""
    quarter = torch.finfo(torch.promote_types(dtype, torch.float32)).max / 4
    count = max(count, 1)
    norm = norm_limit(dtype, factor)

    def holds(p: float) -> bool:  # p sqrt(count) <= norm, as count <= (norm / p)^2 in integers (exact)
        apart = math.frexp(norm)[1] - math.frexp(p)[1]
        return apart >= 0 and count <= 4 ** apart and count * p * p <= quarter
    return largest_power_of_two(holds, min(norm / math.sqrt(count), math.sqrt(quarter / count)))


def scale_of(top: torch.Tensor, limit: float) -> torch.Tensor:
    """Per value of `top` (a magnitude >= 0): 1 where it is at most `limit`, else the power of two 2^-e
    with top = f 2^e, f in [0.5, 1), bringing it into [0.5, 1) (exact: f / top); NaN where it is +inf
    (a non-finite input stays non-finite). In top's dtype."""
    return torch.where(top > limit, torch.frexp(top).mantissa / top, 1.0)


def downscale(x: torch.Tensor, dims: tuple[int, ...], limit: float) -> torch.Tensor:
    """`scale_of` each matrix's largest |entry| (over `dims`, kept as size 1): the power of two to multiply
    x by before squaring it (1 for an empty matrix)."""
    if any(x.shape[d] == 0 for d in dims):  # (no largest entry to take)
        return torch.ones_like(x.sum(dim=dims, keepdim=True))
    return scale_of(torch.linalg.vector_norm(x, math.inf, dim=dims, keepdim=True), limit)


def scaled_and_cast(x: torch.Tensor, dims: tuple[int, ...], limit: float, dtype: torch.dtype,
                    kernels: Kernels = TORCH) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x scale in `dtype`, its Frobenius norm over `dims` (kept), scale in `dtype`, the norm's shape): scale the
    power of two of `downscale(x, dims, limit)`, 1 where every |entry| is within `limit`; the cast x scale has
    x's strides.

    Where `kernels` allow (optimizers/kernels.py; a stack [B, m, n] over its last two dims, the dtypes and
    layouts of elementwise.scaled_and_cast), the cast and the scales come from one Triton launch, the bits of
    the torch form below: it casts x and takes each matrix's largest |entry|, and rewrites only the matrices
    whose scale is not 1; then the norm of the cast. Launch for launch, that is the normaliser without the
    overflow pass (cast, norm), and the scale's rounding to `dtype` is the one `denominator` would make.
    Else, on CPU, where reading a value costs no device synchronisation, the cast and its norm come first: a
    finite norm within limit / 2 bounds every |entry| of the matrix below `limit` (the halving covers the
    cast's and the norm's rounding), so its scale is 1 and the cast and norm are already the results, bit
    for bit; only a stack holding a matrix beyond it (or a non-finite one) takes the torch form.
    Elsewhere the torch form runs: `downscale`, then x times its scale, cast as it is written (no host
    synchronisation: CUDA graphs capture either form)."""
    stack = x.ndim == 3 and sorted(d % 3 for d in dims) == [1, 2]
    fused = elementwise.scaled_and_cast(x, limit, dtype, kernels) if stack else None
    if fused is not None:
        cast, scale = fused
        return cast, frobenius(cast, dims, keepdim=True), scale
    if x.device.type == "cpu":
        cast = x.to(dtype)
        norm = frobenius(cast, dims, keepdim=True)
        if bool((norm <= limit / 2).all()):
            return cast, norm, torch.ones_like(norm)
    scale = downscale(x, dims, limit)
    cast = torch.mul(x, scale, out=torch.empty_like(x, dtype=dtype))  # one pass: scaled and cast
    return cast, frobenius(cast, dims, keepdim=True), scale.to(dtype)


def denominator(norm: torch.Tensor, factor: float, eps: float, scale: torch.Tensor) -> torch.Tensor:
    """The normaliser's denominator of X scale, (factor ||X|| + eps) scale = norm * factor + eps scale, from
    norm = ||X scale|| (`downscale`), in norm's dtype. Where scale = 1 it rounds as the unscaled
    `norm * factor + eps` (eps joins in the op's arithmetic, as a Python scalar does); a scale below the
    dtype's range (fp16) drops eps scale, far below the rounding of factor ||X scale|| >= factor / 2."""
    return torch.add(norm * factor, scale.to(norm.dtype), alpha=eps)
