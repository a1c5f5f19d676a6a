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
"""

from __future__ import annotations

import math

import torch

CASCADE_FROM = 1 << 16
"""Elements per norm from which the CPU norm is a cascade sum (torch's kernel is ~12 u off there, and grows)."""


def frobenius(x: torch.Tensor, dim: int | tuple[int, ...], keepdim: bool = False) -> torch.Tensor:
    """sqrt(sum of x² over `dim`), in x's dtype (half types summed in fp32)."""
    count = math.prod(x.shape[d] for d in ((dim,) if isinstance(dim, int) else dim))
    if x.device.type != "cpu" or x.dtype == torch.float64 or count < CASCADE_FROM:
        return torch.linalg.vector_norm(x, dim=dim, keepdim=keepdim)
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    return wide.square().sum(dim=dim, keepdim=keepdim).sqrt().to(x.dtype)
