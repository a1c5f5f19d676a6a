"""Products known to be symmetric, computed by their lower block triangle.

The Newton–Schulz family forms symmetric m x m products: A = X Xᵀ, bA + cA², and in the Gram
iteration every product of R with a polynomial in R (they commute). Splitting the rows into k
blocks and computing, for row block i, only the columns of blocks 0..i costs (k + 1) / (2k) of
the full product (5/8 for k = 4); the blocks above the diagonal are then copied from the
transposed blocks below it (m² copies against 2 m² n multiply-adds). Each computed entry is the
same dot product as in the full product, so the lower triangle matches it; the upper triangle is
the exact mirror, where a full product is symmetric only up to rounding.

Stacks with fewer than `2 * BLOCK` rows take one plain product: below that a row block is too
small to keep a GPU's tensor cores busy. Pure torch, every device; where the call's `kernels`
allow (optimizers/kernels.py: a group's `fused` option), bf16/fp16 stacks on CUDA take instead the
Triton kernel of optimizers/symmetric_triton.py (upper tiles only, one launch): by default from
`TRITON_ROWS` rows (`GRAPHED_ROWS` in a megabatch a CUDA graph records), with fused=True at any size.
"""

from __future__ import annotations

from types import ModuleType

import torch

from optimizers.kernels import TORCH, Kernels
from optimizers.optional import triton_module

BLOCK = 1024
"""Rows per block (at least): m >= 2 * BLOCK is split into m // BLOCK blocks, at most `MAX_BLOCKS`."""

MAX_BLOCKS = 4
"""Block count cap: 4 blocks compute 5/8 of the product; more blocks save less per extra launch."""

TRITON_ROWS = 2 * BLOCK
"""Rows from which a product takes the Triton kernel under fused=None (optimizers/kernels.py): below them
cuBLAS's product is the faster on one H200 (12 x 768 x 2304: every kernel variant 1.0-4x slower;
optimizers/symmetric_triton.py). To be measured by `benchmarks/kernel_thresholds.py --products`, whose
crossover line names the row count from which the kernel wins on every product kind."""

GRAPHED_ROWS = 256
"""Rows from which a product of a megabatch a CUDA graph records (kernels.in_graph) takes the Triton kernel under
fused=None. A replayed launch costs the host nothing, and side by side on the graph's streams the kernel wins
from fewer rows than alone: `benchmarks/kernel_thresholds.py --graphed` times whole default steps with graphs
and names the smallest threshold from which every step is at least as fast as with TRITON_ROWS."""


def blocks(m: int, block: int | None = None) -> int:
    """How many row blocks an m x m symmetric product is split into (1: one plain product);
    `block` defaults to `BLOCK`, read at the call (so a benchmark can switch the split off)."""
    block = BLOCK if block is None else block
    return min(MAX_BLOCKS, m // block) if m >= 2 * block else 1


def symmetric_bmm(a: torch.Tensor, b: torch.Tensor, block: int | None = None, kernels: Kernels = TORCH) -> torch.Tensor:
    """a @ b for stacks a [B, m, k], b [B, k, m] whose product is symmetric, by its lower block triangle (or
    on the Triton kernel, where `kernels` allow)."""
    return _lower_blocks(None, a, b, 0.0, 1.0, block, kernels)


def symmetric_baddbmm(input: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1.0,
                      alpha: float = 1.0, block: int | None = None, kernels: Kernels = TORCH) -> torch.Tensor:
    """torch.baddbmm(input, a, b, beta=beta, alpha=alpha) for a symmetric `input` [B, m, m] and a
    symmetric product a @ b, by its lower block triangle (or on the Triton kernel, where `kernels` allow)."""
    return _lower_blocks(input, a, b, beta, alpha, block, kernels)


def adds_identity(a: torch.Tensor, kernels: Kernels) -> bool:
    """Products of `a`'s shape, dtype and device run on the Triton kernel (`kernels` allow it at this many
    rows, bf16/fp16 on CUDA, triton installed), so `polynomial_with_identity` can form aI + bA + cA² in one
    rounding and the Newton–Schulz steps use it (`polynomial_product`, Gram Newton–Schulz's W)."""
    return _kernel_for(a, kernels) is not None


def polynomial_with_identity(c: torch.Tensor, a: float, b: float, alpha: float, kernels: Kernels) -> torch.Tensor:
    """W = a I + b C + alpha C·C for a symmetric stack C [B, m, m] on the Triton kernel, every entry
    rounded once from fp32 (the identity added in the kernel's epilogue: no copy, no second pass); only
    where `adds_identity(c, kernels)`."""
    kernel = _kernel_for(c, kernels)
    if kernel is None:
        raise ValueError(f"the identity is added by the Triton kernel only, which cannot take {tuple(c.shape)} "
                         f"{c.dtype} on {c.device} (symmetric.adds_identity)")
    return kernel.symmetric_baddbmm(c, c, c, b, alpha, identity=a)


def polynomial_product(gram: torch.Tensor, x: torch.Tensor, a: float, b: float, c: float,
                       kernels: Kernels = TORCH) -> torch.Tensor:
    """(a I + b A + c A²) X for a symmetric stack A = gram [B, m, m] and x [B, m, n]: one Newton–Schulz step.

    Where `adds_identity(gram, kernels)`: W = aI + bA + cA² by the kernel and W X by one plain product. Elsewhere
    B = bA + cA² by lower blocks and aX + B X by one baddbmm, which first copies X into its output (on the
    24-layer set's 96 squares of 4096, 1.5 ms a call, 7.6 ms an optimizer step). The two round differently (W's diagonal a + B_ii
    rounded once in bf16/fp16, against B_ii rounded and aX summed in the product's fp32): the same map,
    each judged against the oracle."""
    kernel = _kernel_for(gram, kernels)
    if kernel is not None:
        return torch.bmm(kernel.symmetric_baddbmm(gram, gram, gram, b, c, identity=a), x)
    poly = symmetric_baddbmm(gram, gram, gram, beta=b, alpha=c)
    return torch.baddbmm(x, poly, x, beta=a)


def _kernel_for(a: torch.Tensor, kernels: Kernels) -> ModuleType | None:
    """optimizers.symmetric_triton where a product of `a`'s stack runs on it under `kernels`, else None."""
    if not kernels.on or (kernels.sized and a.size(-2) < (GRAPHED_ROWS if kernels.graphed else TRITON_ROWS)):
        return None
    kernel = triton_kernel()
    return kernel if kernel is not None and kernel.usable(a) else None


def _lower_blocks(input: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, beta: float, alpha: float,
                  block: int | None, kernels: Kernels) -> torch.Tensor:
    """beta * input + alpha * (a @ b) (input None: alpha * (a @ b)) by row blocks, mirrored, or on the kernel."""
    m = a.size(-2)
    kernel = _kernel_for(a, kernels)
    if kernel is not None:
        return kernel.symmetric_baddbmm(input, a, b, beta, alpha)
    k = blocks(m, block)
    if k == 1:
        return torch.bmm(a, b) if input is None else torch.baddbmm(input, a, b, beta=beta, alpha=alpha)
    edges = [i * m // k for i in range(k + 1)]
    out = torch.empty(a.shape[:-1] + (m,), dtype=a.dtype, device=a.device)
    for lo, hi in zip(edges, edges[1:]):
        rows, cols = a[:, lo:hi], b[:, :, :hi]
        if input is None:
            out[:, lo:hi, :hi] = torch.bmm(rows, cols)
        else:
            out[:, lo:hi, :hi] = torch.baddbmm(input[:, lo:hi, :hi], rows, cols, beta=beta, alpha=alpha)
    for lo, hi in zip(edges, edges[1:-1]):
        out[:, lo:hi, hi:] = out[:, hi:, lo:hi].mT
    return out


def triton_kernel() -> ModuleType | None:
    """optimizers.symmetric_triton, or None where triton cannot be imported (optimizers/optional.py)."""
    return triton_module("symmetric_triton")
