"""The Frobenius norm our stages divide by, accurate on CPU too.

torch's CPU norm kernel accumulates fp32 (and half types, widened to fp32) in one fp32 accumulator per
vector lane, so its error grows with the count (pytorch/pytorch#169237, open): on a 2048 x 4608 Gaussian
matrix it is 3.2e-4 relative (torch 2.13), 6e-6 on 512 x 1152, where torch.sum's cascade summation is
within 2e-8. Through the normaliser that error moves the whole orthogonalized update: Polar Express in fp32
on the 2048 x 4608 matrix came out 3.2e-4 off after one step, 4.9e-4 after five (the harness's `gpu` tier
flagged it at 26x its allowance). So on CPU the sum of squares is torch.sum's; elsewhere (CUDA's tree
reductions) and in fp64 it is torch's norm.
"""

from __future__ import annotations

import torch


def frobenius(x: torch.Tensor, dim: int | tuple[int, ...], keepdim: bool = False) -> torch.Tensor:
    """sqrt(sum of x² over `dim`), in x's dtype (half types summed in fp32)."""
    if x.device.type != "cpu" or x.dtype == torch.float64:
        return torch.linalg.vector_norm(x, dim=dim, keepdim=keepdim)
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    return wide.square().sum(dim=dim, keepdim=keepdim).sqrt().to(x.dtype)
