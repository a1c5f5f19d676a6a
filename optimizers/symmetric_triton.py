"""A Triton kernel for symmetric products: beta * C + alpha * (A @ B) computed on its upper tiles only.

For a stack A [B, m, k], B [B, k, m] whose product is symmetric (and C, when given, symmetric too), the
m x m result is cut into T x T tiles of TILE rows; one program computes tile (i, j) for i <= j (fp32
accumulation over k) and stores it at (i, j) and, transposed, at (j, i). That is T (T + 1) / 2 of the
T² tiles: 0.52 of the full product's multiply-adds at m = 4096 (T = 32), against 5/8 for the four row
blocks of optimizers/symmetric.py, in one launch and with no mirror copy. A diagonal tile is computed
whole; an off-diagonal tile's mirror is its exact transpose.

Optional: Triton is imported when this module is (CUDA machines with triton; CPU tests under
TRITON_INTERPRET=1). optimizers/symmetric.py calls it only when `symmetric.TRITON` is set, the
operands are bf16 or fp16, and `usable` holds; otherwise the pure-torch blocks run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

DTYPES = (torch.bfloat16, torch.float16)
"""Operand dtypes the kernel takes (tensor-core dot products, fp32 accumulation)."""

TILE, TILE_K, WARPS, STAGES = 128, 64, 8, 3
"""Tile rows/columns, reduction step, warps and pipeline stages on a GPU (H100/H200-class)."""


@dataclass
class KernelStats:
    """Products this process computed with the kernel (benchmarks/gpu_step.py notes them per row)."""

    products: int = 0


STATS = KernelStats()


def interpreted() -> bool:
    """True under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


INDEX_LIMIT = 2**31
"""Offsets within one matrix of the stack are int32 in the kernel (the batch offset is int64)."""


def usable(a: torch.Tensor) -> bool:
    """The kernel can run on `a`'s device and dtype: CUDA (or the interpreter on CPU), bf16/fp16, and
    each matrix of the stack spans fewer than INDEX_LIMIT elements."""
    return (a.dtype in DTYPES and (a.is_cuda or (interpreted() and a.device.type == "cpu"))
            and int32_offsets(tuple(a.shape), a.stride()))


def int32_offsets(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Every offset within one matrix of a stack [B, m, k] (strided) and of its m x m product is below
    INDEX_LIMIT."""
    span = sum((n - 1) * abs(s) for n, s in zip(shape[1:], stride[1:])) + 1
    return max(span, shape[-2] ** 2) < INDEX_LIMIT


@triton.jit
def _upper_tiles(a_ptr, b_ptr, c_ptr, out_ptr, pairs_ptr, m, k,
                 sab, sam, sak, sbb, sbk, sbn, scb, scm, scn, sob, som, son, alpha, beta,
                 HAS_C: tl.constexpr, TILE_M: tl.constexpr, TILE_R: tl.constexpr):
    pair = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)  # batch * stride passes 2^31 on large stacks (72 x 4096 x 11008)
    ti, tj = tl.load(pairs_ptr + 2 * pair), tl.load(pairs_ptr + 2 * pair + 1)
    rows = ti * TILE_M + tl.arange(0, TILE_M)
    cols = tj * TILE_M + tl.arange(0, TILE_M)
    red = tl.arange(0, TILE_R)
    acc = tl.zeros((TILE_M, TILE_M), dtype=tl.float32)
    for k0 in range(0, k, TILE_R):
        ks = k0 + red
        a = tl.load(a_ptr + batch * sab + rows[:, None] * sam + ks[None, :] * sak,
                    mask=(rows[:, None] < m) & (ks[None, :] < k), other=0.0)
        b = tl.load(b_ptr + batch * sbb + ks[:, None] * sbk + cols[None, :] * sbn,
                    mask=(ks[:, None] < k) & (cols[None, :] < m), other=0.0)
        acc += tl.dot(a, b)
    acc = acc * alpha
    inside = (rows[:, None] < m) & (cols[None, :] < m)
    if HAS_C:
        c = tl.load(c_ptr + batch * scb + rows[:, None] * scm + cols[None, :] * scn, mask=inside, other=0.0)
        acc += beta * c.to(tl.float32)
    result = acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + batch * sob + rows[:, None] * som + cols[None, :] * son, result, mask=inside)
    if ti != tj:
        tl.store(out_ptr + batch * sob + cols[None, :] * som + rows[:, None] * son, result, mask=inside)


_PAIRS: dict[tuple[int, str], torch.Tensor] = {}


def _pairs(tiles: int, device: torch.device) -> torch.Tensor:
    """(i, j) for i <= j < tiles, as an int32 [P, 2] tensor on `device` (cached)."""
    key = (tiles, str(device))
    if key not in _PAIRS:
        pairs = [(i, j) for i in range(tiles) for j in range(i, tiles)]
        _PAIRS[key] = torch.tensor(pairs, dtype=torch.int32, device=device)
    return _PAIRS[key]


def symmetric_baddbmm(input: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, beta: float = 1.0,
                      alpha: float = 1.0, tile: int | None = None, tile_k: int | None = None) -> torch.Tensor:
    """beta * input + alpha * (a @ b) for a [B, m, k], b [B, k, m] with a symmetric product (and a
    symmetric `input` [B, m, m], or None: alpha * (a @ b)), by upper tiles, in a's dtype; `tile`,
    `tile_k` default to TILE, TILE_K (read at the call)."""
    tile, tile_k = tile or TILE, tile_k or TILE_K
    if not usable(a) or b.dtype != a.dtype or (input is not None and input.dtype != a.dtype):
        raise ValueError(f"the Triton symmetric product takes {DTYPES} on CUDA (or the interpreter), got "
                         f"{a.dtype} on {a.device}")
    batch, m, k = a.shape
    if b.shape != (batch, k, m) or (input is not None and input.shape != (batch, m, m)):
        raise ValueError(f"shapes {tuple(a.shape)} @ {tuple(b.shape)} (+ {None if input is None else tuple(input.shape)}) "
                         f"do not make a stack of square products")
    out = torch.empty(batch, m, m, dtype=a.dtype, device=a.device)
    tiles = triton.cdiv(m, tile)
    pairs = _pairs(tiles, a.device)
    c = out if input is None else input
    extra = {} if interpreted() else dict(num_warps=WARPS, num_stages=STAGES)
    _upper_tiles[(pairs.shape[0], batch)](
        a, b, c, out, pairs, m, k, *a.stride(), *b.stride(), *c.stride(), *out.stride(),
        float(alpha), float(beta), HAS_C=input is not None, TILE_M=tile, TILE_R=tile_k, **extra)
    STATS.products += 1
    return out
