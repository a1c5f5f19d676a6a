"""Triton kernels for Muon's two elementwise passes over fp32 parameters, each one launch for a whole group
or megabatch (a table of the tensors' addresses, as torch._foreach_* does) and one read and write of each
tensor:

  momentum   M <- mu M + G                      (M, G fp32; and each new M's sum of squares, in fp64 parts:
                                                 the normaliser's norm without a pass of its own)
  divide     (X f) / d, rounded to bf16/fp16    (X fp32, one d and optionally one power-of-two f per matrix:
                                                 Gram Newton-Schulz's normaliser, f its overflow scale; or X
                                                 and d bf16/fp16: Polar Express's normaliser of its cast)
  scaled_and_cast  X s, rounded to bf16/fp16/fp32, and s = norms.scale_of(max |X|) per matrix
                                                (X fp32 or bf16: the normaliser's overflow-safe cast, one
                                                 read of X where no matrix needs scaling)
  apply      X <- X (1 - lr wd) + alpha O       (X fp32; O the orthogonalized matrices, bf16/fp16/fp32,
                                                 row-major or a transposed view: widened in registers)

The torch passes they replace (optimizers/algorithms/muon.py `momentum_directions`, base.py
`decoupled_apply_all` and the cast of the result to the parameters' dtype) read and write every element
two to three times more; torch's mixed-dtype division (optimizers/gram_newton_schulz.py `normalised`) ran at
~1.2 TB/s on an H200. Bits: momentum rounds the product and the sum separately, as `mul_` then `add_`
do (compiled with `enable_fp_fusion=False`); apply rounds the decay product, then adds alpha O with one
fused multiply-add, as torch's `add_(O, alpha=...)` does on CUDA; divide divides correctly rounded
(`div_rn`) and rounds to nearest even (tests/test_elementwise_triton.py checks all three against torch);
scaled_and_cast writes the bits of norms.py's torch form, `downscale` then `torch.mul(x, scale, out=<dtype>)`
(tests/test_norms_triton.py).

Optional: imported by optimizers/elementwise.py only where triton is (CUDA machines; CPU tests under
TRITON_INTERPRET=1).
"""

from __future__ import annotations

import types
from collections import OrderedDict
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from optimizers.launches import launch
from optimizers.optional import interpreted

BLOCK = 4096
"""Elements per program and loop turn of the momentum kernel."""

PROGRAMS = 1024
"""Programs per tensor of the momentum kernel at most (each loops over its share of the tensor)."""

TILE_R, TILE_C = 64, 64
"""Rows and columns of one apply tile (a transposed result is read coalesced and transposed in registers)."""


@triton.jit
def _momentum(buf_table, grad_table, numel_table, parts_ptr, mu, BLOCK: tl.constexpr):
    # program (p, t): its share of tensor t, and that share's sum of squares of the new M (fp64 lanes) at
    # parts[t, p]
    t = tl.program_id(1)
    buf = tl.load(buf_table + t).to(tl.pointer_type(tl.float32))
    grad = tl.load(grad_table + t).to(tl.pointer_type(tl.float32))
    n = tl.load(numel_table + t)
    squares = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inside = offs < n
        m = tl.load(buf + offs, mask=inside, other=0.0)
        g = tl.load(grad + offs, mask=inside, other=0.0)
        new = m * mu + g
        tl.store(buf + offs, new, mask=inside)
        wide = new.to(tl.float64)
        squares += wide * wide  # exact: an fp32 square has at most 48 significant bits
    tl.store(parts_ptr + t * tl.num_programs(0) + tl.program_id(0), tl.sum(squares))


@triton.jit
def _apply(param_table, o_ptr, per_param, rows, cols, sob, sor, soc, decay, alpha,
           HAS_DECAY: tl.constexpr, TILE_R: tl.constexpr, TILE_C: tl.constexpr):
    b = tl.program_id(1)  # matrix b of the result: matrix b % per_param of parameter b // per_param
    tiles_c = tl.cdiv(cols, TILE_C)
    r = (tl.program_id(0) // tiles_c) * TILE_R + tl.arange(0, TILE_R)
    c = (tl.program_id(0) % tiles_c) * TILE_C + tl.arange(0, TILE_C)
    inside = (r[:, None] < rows) & (c[None, :] < cols)
    x_ptr = tl.load(param_table + b // per_param).to(tl.pointer_type(tl.float32))
    x_ptr += (b % per_param).to(tl.int64) * rows * cols
    xs = x_ptr + r[:, None] * cols + c[None, :]
    o = tl.load(o_ptr + b.to(tl.int64) * sob + r[:, None] * sor + c[None, :] * soc, mask=inside)
    x = tl.load(xs, mask=inside)
    if HAS_DECAY:
        x = x * decay
    tl.store(xs, tl.fma(o.to(tl.float32), alpha, x), mask=inside)


@triton.jit
def _divide(x_ptr, d_ptr, f_ptr, out_ptr, per_matrix, HAS_FACTOR: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(1)
    d = tl.load(d_ptr + b).to(tl.float32)  # fp32, or bf16/fp16 widened exactly (as torch's opmath widens them)
    base = b.to(tl.int64) * per_matrix
    for start in range(tl.program_id(0) * BLOCK, per_matrix, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inside = offs < per_matrix
        x = tl.load(x_ptr + base + offs, mask=inside).to(tl.float32)
        if HAS_FACTOR:  # x f in f's precision (fp64: exact), rounded to fp32, as torch's promoting mul rounds it
            f = tl.load(f_ptr + b)
            x = (x.to(f.dtype) * f).to(tl.float32)
        tl.store(out_ptr + base + offs, tl.math.div_rn(x, d).to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _top(values):
    # the largest of `values` (magnitudes), NaN where one is NaN (tl.max leaves NaN unspecified)
    nan = values != values
    return tl.where(tl.max(nan.to(tl.int32)) > 0, float("nan"), tl.max(tl.where(nan, 0.0, values)))


@triton.jit
def _rounded(v, dtype: tl.constexpr):
    # fp32 v rounded to nearest even to `dtype`, as torch's casts round: to bf16 on the bits (the interpreter's
    # bf16 conversion truncates), a NaN kept a quiet NaN
    if dtype == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        even = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        even = tl.where(v != v, (bits >> 16) | 0x40, even)
        return even.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return v.to(dtype)


@triton.jit
def _widened(x):
    # x (bf16 or fp32) exactly in fp32, the precision its magnitudes and products are taken in; bf16 on the bits
    # (the interpreter's conversion of a bf16 subnormal is off)
    if x.dtype == tl.bfloat16:
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def _scale_of(top, limit):
    # norms.scale_of: 1 where top <= limit (or NaN); else f / top = 2^-e for top = f 2^e, f in [0.5, 1) (f: top's
    # mantissa under the exponent of 0.5; the quotient is a power of two, exact); NaN where top = +inf
    f = ((top.to(tl.int32, bitcast=True) & 0x7FFFFF) | 0x3F000000).to(tl.float32, bitcast=True)
    power = tl.math.div_rn(f, top)
    power = tl.where(top == float("inf"), float("nan"), power)
    return tl.where(top > limit, power, 1.0)


@triton.jit
def _scaled_cast(x_ptr, out_ptr, parts_ptr, count_ptr, scale_ptr, per_matrix, limit, PARTS: tl.constexpr,
                 BLOCK: tl.constexpr):
    # program (p, b): its share of matrix b rounded to out's dtype, and the share's largest |entry| (NaN where one
    # is NaN) at parts[b, p]; the last of matrix b's programs to finish (an arrival count at count_ptr[b], which
    # it leaves 0 for the next launch) forms b's scale from the parts and, where it is not 1, rewrites the whole
    # matrix as x scale, rounded to x's dtype, then to out's
    b = tl.program_id(1)
    programs = tl.num_programs(0)
    base = b.to(tl.int64) * per_matrix
    top = tl.zeros([BLOCK], dtype=parts_ptr.dtype.element_ty)
    for start in range(tl.program_id(0) * BLOCK, per_matrix, programs * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inside = offs < per_matrix
        x = _widened(tl.load(x_ptr + base + offs, mask=inside, other=0.0))
        tl.store(out_ptr + base + offs, _rounded(x, out_ptr.dtype.element_ty), mask=inside)
        magnitude = tl.abs(x)
        top = tl.where((magnitude > top) | (magnitude != magnitude), magnitude, top)  # a NaN stays
    tl.store(parts_ptr + b * programs + tl.program_id(0), _top(top))
    tl.debug_barrier()  # every thread's stores before the arrival (released by the atomic)
    if tl.atomic_add(count_ptr + b, 1, sem="acq_rel") == programs - 1:
        tl.atomic_xchg(count_ptr + b, 0)
        p = tl.arange(0, PARTS)
        whole = _top(tl.load(parts_ptr + b * programs + p, mask=p < programs, other=0.0, cache_modifier=".cg"))
        scale = _scale_of(whole, limit)
        tl.store(scale_ptr + b, _rounded(scale, scale_ptr.dtype.element_ty))
        if whole > limit:  # (rare: entries near the dtype's range) this one program rewrites the matrix
            for at in range(0, per_matrix, BLOCK):
                rest = at + tl.arange(0, BLOCK)
                within = rest < per_matrix
                entry = tl.load(x_ptr + base + rest, mask=within)
                product = _widened(_rounded(_widened(entry) * scale, x_ptr.dtype.element_ty))
                tl.store(out_ptr + base + rest, _rounded(product, out_ptr.dtype.element_ty), mask=within)


_EXACT = types.MappingProxyType({} if interpreted() else dict(enable_fp_fusion=False))
"""Launch options: separate roundings where the kernel's source writes them separately."""


TABLES = 256
"""Device-side address tables kept (least recently used dropped first)."""

_TABLES: OrderedDict[tuple, torch.Tensor] = OrderedDict()
"""`_table`'s device copies by (device, values): memoization (each is a function of its key), at most TABLES."""


def _table(values: list[int], device: torch.device) -> torch.Tensor:
    """`values` as an int64 tensor on `device`, cached by value: the same parameters, buffers and (from the
    caching allocator) gradients come back every step, and a copy from pageable host memory would make the
    host wait for the GPU. A new table is copied from pinned memory, asynchronously."""
    if device.type == "meta":  # a rehearsal's (optimizers/launches.py): not kept
        return torch.empty(len(values), dtype=torch.int64, device=device)
    key = (str(device), *values)
    table = _TABLES.get(key)
    if table is None:
        host = torch.tensor(values, dtype=torch.int64)
        if device.type == "cuda":
            host = host.pin_memory()
        table = _TABLES[key] = host.to(device, non_blocking=True)
        if len(_TABLES) > TABLES:
            _TABLES.popitem(last=False)
    else:
        _TABLES.move_to_end(key)
    return table


def _addresses(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    return _table([t.data_ptr() for t in tensors], device)


def momentum_(bufs: list[torch.Tensor], grads: list[torch.Tensor], mu: float) -> torch.Tensor:
    """M <- mu M + G for every pair, in place (fp32, contiguous, same numel pairwise): one launch. Returns
    the new M's sums of squares in parts, [len(bufs), P] fp64: summed over dim 1, each M's squared
    Frobenius norm (each square exact, the sums rounded in fp64)."""
    device = bufs[0].device
    numels = _table([b.numel() for b in bufs], device)
    programs = min(PROGRAMS, triton.cdiv(max(b.numel() for b in bufs), BLOCK))
    parts = torch.empty(len(bufs), programs, dtype=torch.float64, device=device)
    launch(_momentum, (programs, len(bufs)), _addresses(bufs, device), _addresses(grads, device), numels, parts,
           float(mu), BLOCK=BLOCK, **_EXACT)
    return parts


def apply_(params: list[torch.Tensor], matrices: torch.Tensor, decay: float | None, alpha: float) -> None:
    """X <- X decay + alpha O for each parameter X (fp32, contiguous) and its matrices O, the
    len(matrices) // len(params) consecutive matrices of `matrices` [B, m, n] (any strides; their
    row-major order is the parameter's): one launch. decay None: no decay product."""
    batch, rows, cols = matrices.shape
    grid = (triton.cdiv(rows, TILE_R) * triton.cdiv(cols, TILE_C), batch)
    launch(_apply, grid, _addresses(params, matrices.device), matrices, batch // len(params), rows, cols,
           *matrices.stride(), 1.0 if decay is None else float(decay), float(alpha), HAS_DECAY=decay is not None,
           TILE_R=TILE_R, TILE_C=TILE_C, **_EXACT)


def divide(x: torch.Tensor, denominators: torch.Tensor, dtype: torch.dtype,
           factors: torch.Tensor | None = None) -> torch.Tensor:
    """x / d per matrix of x [B, m, n] (fp32, bf16 or fp16, each matrix a dense block of its own, in any order
    of its two dims), widened to fp32, correctly rounded in fp32 and then rounded to `dtype`, as
    `torch.div(x, d, out=<dtype>)` rounds it; `denominators` [B, 1, 1] in x's dtype; with `factors` f [B, 1, 1]
    (fp32 or fp64) and fp32 x, (x f) / d, x f formed in f's precision and rounded to fp32 first
    (`torch.mul(x, f, out=<fp32>)`). The result has x's strides. One launch."""
    out = torch.empty_like(x, dtype=dtype)
    per_matrix = x.size(1) * x.size(2)
    programs = min(PROGRAMS, triton.cdiv(per_matrix, BLOCK))
    f = denominators if factors is None else factors.contiguous()  # (an unread pointer without factors)
    launch(_divide, (programs, x.size(0)), x, denominators.contiguous(), f, out, per_matrix,
           HAS_FACTOR=factors is not None, BLOCK=BLOCK, **_EXACT)
    return out


def scaled_and_cast(x: torch.Tensor, limit: float, dtype: torch.dtype, counts: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x scale rounded to `dtype`, scale [B, 1, 1] rounded to `dtype`) for x [B, m, n] (fp32 or bf16, each
    matrix a dense block of its own, in any order of its two dims; 0 < B <= elementwise.GRID_ROWS, m n > 0), dtype
    bf16, fp16 or fp32, `limit` a float fp32 holds exactly: scale = norms.scale_of(max |entry| of the matrix,
    limit), the bits of norms.py's `downscale` then `torch.mul(x, scale, out=torch.empty_like(x, dtype=dtype))`
    (the product in x's precision, rounded to x's dtype, then to `dtype`) and `scale.to(dtype)`. The result has
    x's strides. One launch: the cast and per-program largest entries; each matrix's last program to finish (by
    `counts`, B of `arrivals`) forms its scale and, where that is not 1, rewrites the matrix (a second pass, by
    one program)."""
    batch, per_matrix = x.size(0), x.size(1) * x.size(2)
    programs = min(PROGRAMS, triton.cdiv(per_matrix, BLOCK))
    out = torch.empty_like(x, dtype=dtype)
    parts = torch.empty(batch, programs, dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
    scale = torch.empty(batch, 1, 1, dtype=dtype, device=x.device)
    launch(_scaled_cast, (programs, batch), x, out, parts, counts, scale, per_matrix, float(limit),
           PARTS=PROGRAMS, BLOCK=BLOCK)
    return out, scale


ARRIVALS = 1 << 18
"""Arrival counts in a device's ring (1 MiB of int32): launches take consecutive runs of it in turn."""

@dataclass
class _Ring:
    """A device's arrival counts [ARRIVALS] int32, each 0 at rest, and where the next launch's run starts."""

    counts: torch.Tensor
    start: int = 0


_ARRIVALS: dict[str, _Ring] = {}
"""`arrivals`' rings by device: scratch."""


def arrivals(device: torch.device, count: int) -> torch.Tensor | None:
    """`count` arrival counts (int32, each 0) for one launch of `_scaled_cast`, which leaves them 0: the next
    run of the device's ring (from its start where the run would pass its end), so that launches in flight
    together (a CUDA graph's side streams) count apart, and launches one after another (one stream) reuse
    them. None under a CUDA graph's capture before the device has its ring: its zeroing would be captured, not
    run (the caller takes the torch form)."""
    if device.type == "meta":  # a rehearsal's (optimizers/launches.py): not kept
        return torch.empty(count, dtype=torch.int32, device=device)
    key = str(device)
    if key not in _ARRIVALS:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        _ARRIVALS[key] = _Ring(torch.zeros(ARRIVALS, dtype=torch.int32, device=device))
    ring = _ARRIVALS[key]
    start = ring.start if ring.start + count <= ARRIVALS else 0
    ring.start = start + -(-count // 16) * 16  # runs start 64-byte aligned: one specialization (optimizers/launches.py)
    return ring.counts[start:start + count]
