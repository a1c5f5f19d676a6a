"""A Triton kernel for symmetric products: beta * C + alpha * (A @ B) computed on its upper tiles only.

For a stack A [B, m, k], B [B, k, m] whose product is symmetric (and C, when given, symmetric too), the
m x m result is cut into T x T tiles of TILE rows; one program computes tile (i, j) for i <= j (fp32
accumulation over k) and stores it at (i, j) and, transposed, at (j, i). That is T (T + 1) / 2 of the
T² tiles: 0.52 of the full product's multiply-adds at m = 4096 (T = 32), against 5/8 for the four row
blocks of optimizers/symmetric.py, in one launch and with no mirror copy. A diagonal tile is computed
whole; an off-diagonal tile's mirror is its exact transpose. `identity` adds a multiple of I in the
epilogue, before the one rounding: the Newton-Schulz polynomial aI + bA + cA² in one launch
(optimizers/symmetric.py `polynomial_with_identity`), where the published form needs a copy (aX + BX by
baddbmm; Q = Z + aI by a clone). On the 24-layer step (one H200): 517.94 ms against 532.97 ms, interleaved
rounds (docs/performance.md §2).

Variants (`VARIANTS`, chosen per call by `variant=`, within a `variant(name)` scope for every call
that names none (benchmarks), else the module constant `VARIANT`, "persistent" at 4 warps and 4 stages: the
fastest measured):
  - "base": the kernel above (masked pointer loads, 128 x 128 tiles, row-major tile order);
  - "even": the same with no masks where m and k are multiples of the tiles;
  - "tma": loads through 3-D TMA tensor descriptors over the [B, m, k] stack (host-side
    triton.tools.tensor_descriptor.TensorDescriptor; a transposed view b = xᵀ is read by x's rows and
    fed as tl.trans; likewise an a stored by columns), stores by TMA, tiles in L2 groups of 8 row
    blocks; a diagonal tile's lower half is the transpose of its upper half, so the whole result is
    bitwise symmetric;
  - "persistent": tma's tiles and bits, by one program per SM looping over the (matrix, tile) work items in
    a flattened loop (the next tile's loads issued under this tile's epilogue), with a branch-free
    epilogue. On one H200 (docs/performance.md §3):
    1.84-2.08x cuBLAS on the 24-layer stacks against tma's 1.79-2.04x in the same run, 1.02-1.09x tma
    in a probe of its launches; the 24-layer step 506.88 -> 498.21 ms, interleaved. At 3 stages or
    8 warps it ran 0.83-0.94x tma, with warp specialization 0.57-0.89x, at 5 stages no faster than at 4.
Measured on one H200 (torch 2.11, triton 3.6; benchmarks/symmetric_kernel.py, bf16, ms and the speedup
over cuBLAS's full product):

    | stack                | cuBLAS | base (8 warps, 3 stages) | tma (8, 3)    | tma (4, 4)    |
    | X Xᵀ 96x4096x4096    | 19.37  | 12.76 (1.52x)            | 11.50 (1.68x) | 10.81 (1.80x) |
    | X Xᵀ 72x4096x11008   | 38.82  | 26.83 (1.45x)            | 23.72 (1.64x) | 21.95 (1.80x) |
    | A + A·A 96x4096x4096 | 21.26  | 14.60 (1.46x)            | 11.45 (1.86x) | 11.17 (1.92x) |
    | R + R·R 72x4096x4096 | 16.03  | 11.01 (1.46x)            | 8.67 (1.85x)  | 8.09 (2.08x)  |

(tma at 8 warps, 4 stages: 1.70x, 1.79x, 1.91x, 2.02x.) Every row equals cuBLAS's result bitwise (max
relative difference 0) and its mirror is exact. The 24-layer step (benchmarks/gpu_step.py: Gram
Newton-Schulz, this kernel, the fused elementwise kernels): base 597.6 ms, tma (8, 3) 557.8 ms, tma (4, 4)
550.4 ms. Measured and not variants: "rect" (128 x 256 tiles; 550.1 ms, the same step, but its first step
takes 7.75 s of compiles against tma's 0.85 s) and three other persistent forms (one program per SM looping
over the tiles, plain / tl.range(flatten=True) / tl.range(warp_specialize=True)), which triton 3.6 does not
compile (the tests: "PassManager::run failed"; the benchmark's launches: 320 KiB of shared memory
for the plain one at 4 stages, 272 KiB for the warp-specialized one, past the 227 KiB of an H200 block);
the "persistent" variant above, with a branch-free epilogue, compiles at 4 warps and 4 stages within
168-192 KiB. Also measured (docs/performance.md §3):
warp specialization of the k loop (`tl.range(warp_specialize=True)`) compiles but runs 0.50-0.94x
this kernel; TILE_K 128, 5-6 stages and L2 groups of 4-32 row blocks are slower or within run-to-run noise
(interleaved rounds) on every stack of the 24-layer step. On small stacks (m <= 1536, e.g. 12x768x2304) every variant is
slower than cuBLAS (base 1.0-2.5x, tma 1.5-4x): optimizers/symmetric.py calls the kernel from
TRITON_ROWS rows on.
A descriptor variant runs "base" where this triton has no tensor descriptors or an operand's rows are
not contiguous and 16-byte aligned (`resolve`); a default variant that fails to compile warns once and
runs "base" from then on (`BROKEN`). Each product adds to the current counting scope's `products` and
`variants` (optimizers/counters.py: the optimizer's `stats`).

Optional: Triton is imported when this module is (CUDA machines with triton; CPU tests under
TRITON_INTERPRET=1). optimizers/symmetric.py calls it only where the call's kernels allow (a group's
`fused` option, optimizers/kernels.py), the operands are bf16 or fp16, and `usable` holds; otherwise the
pure-torch blocks run.
"""

from __future__ import annotations

import contextlib
import types
import warnings
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator

import torch
import triton
import triton.language as tl

from optimizers import counters
from optimizers.launches import launch, on_device
from optimizers.optional import interpreted

DTYPES = (torch.bfloat16, torch.float16)
"""Operand dtypes the kernel takes (tensor-core dot products, fp32 accumulation)."""

VARIANT = "persistent"
"""The kernel variant (`VARIANTS` below) `symmetric_baddbmm` runs when neither the call nor a `variant` scope
names one: "persistent" (its launch: 4 warps, 4 stages), the fastest over the 24-layer stacks (62.0 ms for the
five against 117.5 ms by cuBLAS; on one stack, A + A·A, tma is 1% ahead)."""

TILE, TILE_K, WARPS, STAGES = 128, 64, 8, 3
"""Tile rows/columns, reduction step, and the warps and pipeline stages of a variant that names none
(a `Variant`'s own launch comes first), on a GPU (H100/H200-class)."""


INDEX_LIMIT = 2**31
"""Offsets within one matrix of the stack are int32 in the kernel (the batch offset is int64)."""


def usable(a: torch.Tensor) -> bool:
    """The kernel can run on `a`'s device and dtype: CUDA (a meta tensor standing in for one, or the
    interpreter on CPU; optimizers/launches.py), bf16/fp16, and
    each matrix of the stack spans fewer than INDEX_LIMIT elements."""
    return (a.dtype in DTYPES and (on_device(a) or (interpreted() and a.device.type == "cpu"))
            and int32_offsets(tuple(a.shape), a.stride()))


def int32_offsets(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Every offset within one matrix of a stack [B, m, k] (strided) and of its m x m product is below
    INDEX_LIMIT."""
    span = sum((n - 1) * abs(s) for n, s in zip(shape[1:], stride[1:])) + 1
    return max(span, shape[-2] ** 2) < INDEX_LIMIT


@triton.jit
def _upper_tiles(a_ptr, b_ptr, c_ptr, out_ptr, pairs_ptr, m, k,
                 sab, sam, sak, sbb, sbk, sbn, scb, scm, scn, sob, som, son, alpha, beta, identity,
                 HAS_C: tl.constexpr, TILE_M: tl.constexpr, TILE_R: tl.constexpr, EVEN: tl.constexpr = False,
                 HAS_IDENTITY: tl.constexpr = False):
    # EVEN (variant "even"): m % TILE_M == 0 and k % TILE_R == 0, so no load or store is masked.
    # HAS_IDENTITY: `identity` is added to the diagonal in fp32, before the one rounding.
    pair = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)  # batch * stride passes 2^31 on large stacks (72 x 4096 x 11008)
    ti, tj = tl.load(pairs_ptr + 2 * pair), tl.load(pairs_ptr + 2 * pair + 1)
    rows = ti * TILE_M + tl.arange(0, TILE_M)
    cols = tj * TILE_M + tl.arange(0, TILE_M)
    red = tl.arange(0, TILE_R)
    acc = tl.zeros((TILE_M, TILE_M), dtype=tl.float32)
    for k0 in range(0, k, TILE_R):
        ks = k0 + red
        if EVEN:
            a = tl.load(a_ptr + batch * sab + rows[:, None] * sam + ks[None, :] * sak)
            b = tl.load(b_ptr + batch * sbb + ks[:, None] * sbk + cols[None, :] * sbn)
        else:
            a = tl.load(a_ptr + batch * sab + rows[:, None] * sam + ks[None, :] * sak,
                        mask=(rows[:, None] < m) & (ks[None, :] < k), other=0.0)
            b = tl.load(b_ptr + batch * sbb + ks[:, None] * sbk + cols[None, :] * sbn,
                        mask=(ks[:, None] < k) & (cols[None, :] < m), other=0.0)
        acc += tl.dot(a, b)
    acc = acc * alpha
    inside = (rows[:, None] < m) & (cols[None, :] < m)
    if HAS_C:
        if EVEN:
            c = tl.load(c_ptr + batch * scb + rows[:, None] * scm + cols[None, :] * scn)
        else:
            c = tl.load(c_ptr + batch * scb + rows[:, None] * scm + cols[None, :] * scn, mask=inside, other=0.0)
        acc += beta * c.to(tl.float32)
    if HAS_IDENTITY:
        acc = tl.where(rows[:, None] == cols[None, :], acc + identity, acc)
    result = acc.to(out_ptr.dtype.element_ty)
    if EVEN:
        tl.store(out_ptr + batch * sob + rows[:, None] * som + cols[None, :] * son, result)
        if ti != tj:
            tl.store(out_ptr + batch * sob + cols[None, :] * som + rows[:, None] * son, result)
    else:
        tl.store(out_ptr + batch * sob + rows[:, None] * som + cols[None, :] * son, result, mask=inside)
        if ti != tj:
            tl.store(out_ptr + batch * sob + cols[None, :] * som + rows[:, None] * son, result, mask=inside)


@triton.jit
def _tile_tma(a_desc, b_desc, c_desc, batch, r0, c0, k, alpha, beta,
              HAS_C: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr, TILE_M: tl.constexpr, TILE_R: tl.constexpr):
    # alpha * (A B)[r0:, c0:] (+ beta C), the TILE_M x TILE_M tile of matrix `batch` in fp32, loaded by TMA
    acc = tl.zeros((TILE_M, TILE_M), dtype=tl.float32)
    for k0 in range(0, k, TILE_R):
        if A_T:  # a's columns are contiguous (a transposed view): load the [TILE_R, TILE_M] block of aᵀ
            a = tl.trans(a_desc.load([batch, k0, r0]).reshape(TILE_R, TILE_M))
        else:
            a = a_desc.load([batch, r0, k0]).reshape(TILE_M, TILE_R)
        if B_T:  # b's rows are its columns: load the row-major [TILE_M, TILE_R] block of bᵀ, feed it transposed
            b = b_desc.load([batch, c0, k0]).reshape(TILE_M, TILE_R)
            acc = tl.dot(a, tl.trans(b), acc)
        else:
            b = b_desc.load([batch, k0, c0]).reshape(TILE_R, TILE_M)
            acc = tl.dot(a, b, acc)
    acc = acc * alpha
    if HAS_C:  # TMA zero-fills past the matrix's edge
        acc += beta * c_desc.load([batch, r0, c0]).reshape(TILE_M, TILE_M).to(tl.float32)
    return acc


@triton.jit
def _upper_tiles_tma(a_desc, b_desc, c_desc, out_desc, out_ptr, pairs_ptr, k, alpha, beta, identity,
                     HAS_C: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr,
                     TILE_M: tl.constexpr, TILE_R: tl.constexpr, HAS_IDENTITY: tl.constexpr = False):
    # tile (ti, tj), tj >= ti, of matrix `batch`: loads and stores by TMA
    pair = tl.program_id(0)
    batch = tl.program_id(1)
    ti, tj = tl.load(pairs_ptr + 2 * pair), tl.load(pairs_ptr + 2 * pair + 1)
    r0 = ti * TILE_M
    c0 = tj * TILE_M
    acc = _tile_tma(a_desc, b_desc, c_desc, batch, r0, c0, k, alpha, beta, HAS_C, A_T, B_T, TILE_M, TILE_R)
    # Stores past the matrix's edge are clipped. Only a diagonal tile (tj == ti) is symmetrised and stored
    # once: selecting by (tj == ti) in every tile's epilogue ran 0.96-1.02x as fast on the 24-layer stacks,
    # and that step 508.34 against 505.08 ms (docs/performance.md §2).
    if ti == tj:
        idx = tl.arange(0, TILE_M)
        if HAS_IDENTITY:  # `identity` on the diagonal, in fp32 before the one rounding
            acc = tl.where(idx[:, None] == idx[None, :], acc + identity, acc)
        result = acc.to(out_ptr.dtype.element_ty)
        # its lower half is the transpose of its upper half: the tile is bitwise symmetric, stored once
        result = tl.where(idx[:, None] > idx[None, :], tl.trans(result), result)
        out_desc.store([batch, r0, c0], result.reshape(1, TILE_M, TILE_M))
    else:  # wholly above the diagonal: stored, and its transpose at the mirror
        result = acc.to(out_ptr.dtype.element_ty)
        out_desc.store([batch, r0, c0], result.reshape(1, TILE_M, TILE_M))
        out_desc.store([batch, c0, r0], tl.trans(result).reshape(1, TILE_M, TILE_M))


@triton.jit
def _upper_tiles_persistent(a_desc, b_desc, c_desc, out_desc, out_ptr, pairs_ptr, k, pairs, work, alpha, beta,
                            identity, HAS_C: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr,
                            TILE_M: tl.constexpr, TILE_R: tl.constexpr, HAS_IDENTITY: tl.constexpr = False):
    # each program takes work items w = program, program + programs, ...: tile pairs[w % pairs] of matrix
    # w // pairs. The loop is flattened, so the next tile's loads are issued under this tile's epilogue.
    # The epilogue has no branch: every tile stores itself and its transpose; a diagonal tile, symmetrised
    # first (its lower half the transpose of its upper half), stores the same values twice at one place.
    idx = tl.arange(0, TILE_M)
    for item in tl.range(tl.program_id(0), work, tl.num_programs(0), flatten=True):
        batch = item // pairs
        pair = item - batch * pairs
        ti, tj = tl.load(pairs_ptr + 2 * pair), tl.load(pairs_ptr + 2 * pair + 1)
        r0 = ti * TILE_M
        c0 = tj * TILE_M
        acc = _tile_tma(a_desc, b_desc, c_desc, batch, r0, c0, k, alpha, beta, HAS_C, A_T, B_T, TILE_M, TILE_R)
        diagonal = ti == tj
        if HAS_IDENTITY:  # `identity` on the diagonal, in fp32 before the one rounding
            acc = tl.where(diagonal & (idx[:, None] == idx[None, :]), acc + identity, acc)
        result = acc.to(out_ptr.dtype.element_ty)
        result = tl.where(diagonal & (idx[:, None] > idx[None, :]), tl.trans(result), result)
        out_desc.store([batch, r0, c0], result.reshape(1, TILE_M, TILE_M))
        out_desc.store([batch, c0, r0], tl.trans(result).reshape(1, TILE_M, TILE_M))


_PAIRS: dict[tuple, torch.Tensor] = {}
"""`_pairs`' tables by (tiles, device, group): memoization (each is a function of its key)."""


def pair_list(tiles: int, group: int = 0) -> list[tuple[int, int]]:
    """(i, j), i <= j, for the T (T + 1) / 2 upper tiles of an m x m product cut into `tiles` = T blocks
    of TILE rows: each entry on or above the diagonal lies in exactly one. Order: row-major, or with
    `group` > 0 in groups of `group` row blocks, column by column within a group (tiles in flight
    together share their operands in L2)."""
    needed = [(i, j) for i in range(tiles) for j in range(i, tiles)]
    if group <= 0:
        return needed
    return sorted(needed, key=lambda p: (p[0] // group, p[1], p[0]))


def _pairs(tiles: int, device: torch.device, group: int = 0) -> torch.Tensor:
    """pair_list as an int32 [P, 2] tensor on `device` (cached)."""
    key = (tiles, str(device), group)
    if key not in _PAIRS:
        _PAIRS[key] = torch.tensor(pair_list(tiles, group), dtype=torch.int32, device=device)
    return _PAIRS[key]


@dataclass(frozen=True)
class Variant:
    """One way to run the kernel. `descriptors`: TMA loads and stores through tensor descriptors (else
    masked pointer loads); `even`: unmasked pointer loads where the shape allows; `group`: row blocks
    per L2 group of the tile order; `persistent`: one program per SM looping over the (matrix, tile) work
    items (descriptor variants only); `warps`, `stages`: the launch (None: WARPS, STAGES, read at the
    call)."""

    descriptors: bool = False
    even: bool = False
    group: int = 0
    persistent: bool = False
    warps: int | None = None
    stages: int | None = None


VARIANTS = types.MappingProxyType({
    "base": Variant(),
    "even": Variant(even=True),
    # 4 warps, 4 stages: 1.03-1.08x the default launch's 8 warps, 3 stages on the H200 (the table above)
    "tma": Variant(descriptors=True, group=8, warps=4, stages=4),
    # 4 warps, 4 stages: at 3 stages, or 8 warps, 0.83-0.94x "tma" on the 24-layer stacks
    "persistent": Variant(descriptors=True, group=8, persistent=True, warps=4, stages=4),
})
"""The kernel variants, by name: "base" is the plain kernel (masked pointer loads, row-major tile order)."""

STAND_INS = types.MappingProxyType({"persistent": "tma"})
"""A default variant that compiles slowly (persistent: 1.8-2.2 s for its largest specialization on the H200
machine's host, against tma's 0.5-0.9 s) and the variant of the same tiles and bits (every probe and test row
bitwise equal) that runs in its place while its kernels compile in the background (`WARMING`)."""

WARMING: set[str] = set()
"""Default variants whose kernels compile in the background now (optimizers/plan.py `compile_ahead`): until
then the default runs its STAND_INS variant. Process state, as Triton's compiles are the process's: every
optimizer of the process runs the stand-in until the one compile ends."""

BROKEN: dict[str, str] = {}
"""Variants that failed to compile or launch as the default (VARIANT) in this process, with the error:
the default then runs "base" (a variant named in the call or a `variant` scope raises instead). Memoization
of a fact of this process's triton (it cannot build the variant), which no retry changes."""

_CHOSEN: ContextVar[str | None] = ContextVar("optimizers.symmetric_triton.variant", default=None)
"""The variant the innermost `variant` scope of this thread and context chose."""


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """Within: every product that names no variant runs `name` (benchmarks compare variants through a whole
    step), as a call naming it would: without a stand-in, and raising where it fails."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}: one of {sorted(VARIANTS)}")
    token = _CHOSEN.set(name)
    try:
        yield
    finally:
        _CHOSEN.reset(token)


def slow_default() -> str | None:
    """The variant a product naming none runs when that variant compiles slowly (STAND_INS), so that its
    compile may run in the background behind its stand-in (optimizers/plan.py `compile_for`); None where a
    `variant` scope chose one, the default broke (BROKEN), or it has no stand-in."""
    if _CHOSEN.get() is not None or VARIANT in BROKEN or VARIANT not in STAND_INS:
        return None
    return VARIANT


def descriptors_available() -> bool:
    """This triton has host-side tensor descriptors (triton.tools.tensor_descriptor, triton >= 3.4)."""
    return _TensorDescriptor is not None


try:  # absent before triton 3.4: the descriptor variants then fall back to "base"
    from triton.tools.tensor_descriptor import TensorDescriptor as _TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed triton
    _TensorDescriptor = None


def _by_columns(t: torch.Tensor) -> bool:
    """`t`'s matrices are stored by columns (a transposed view): the descriptor spans tᵀ's rows."""
    return t.stride(-2) == 1 and t.stride(-1) != 1


def _descriptor_ok(t: torch.Tensor) -> bool:
    """A 3-D TMA descriptor can span `t`: last stride 1, other strides and the base 16-byte aligned."""
    size = t.element_size()
    return (t.stride(-1) == 1 and all((s * size) % 16 == 0 for s in t.stride()[:-1])
            and t.data_ptr() % 16 == 0)


def resolve(name: str | None, input: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor,
            tile: int | None = None, tile_k: int | None = None) -> str:
    """The variant that runs for `name` (default: the `variant` scope's, else VARIANT, or its stand-in while it
    is WARMING) on these operands: a descriptor variant
    falls back to "base" where triton has no tensor descriptors or an operand's strides do not suit
    TMA (a's and b's rows or columns, input's rows contiguous and 16-byte aligned); "even" runs
    the masked path ("base") where m or k is not a multiple of the tiles."""
    if name is None:
        name = _CHOSEN.get()
    if name is None:
        name = VARIANT if VARIANT not in BROKEN else "base"
        name = STAND_INS[name] if name in WARMING else name
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}: one of {sorted(VARIANTS)}")
    v = VARIANTS[name]
    tile, tile_k = tile or TILE, tile_k or TILE_K
    m, k = a.shape[-2], a.shape[-1]
    if v.even and (m % tile or k % tile_k):
        return "base"
    if v.descriptors:
        a_rows = a.mT if _by_columns(a) else a
        b_rows = b.mT if _by_columns(b) else b
        if (not descriptors_available() or not (_descriptor_ok(a_rows) and _descriptor_ok(b_rows))
                or (m * a.element_size()) % 16):  # the output's rows (the product's own, contiguous)
            return "base"
        if input is not None and not _descriptor_ok(input):
            return "base"
    return name


def symmetric_baddbmm(input: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, beta: float = 1.0,
                      alpha: float = 1.0, tile: int | None = None, tile_k: int | None = None,
                      variant: str | None = None, warps: int | None = None,
                      stages: int | None = None, identity: float = 0.0) -> torch.Tensor:
    """beta * input + alpha * (a @ b) + identity * I for a [B, m, k], b [B, k, m] with a symmetric
    product (and a symmetric `input` [B, m, m], or None: no input term), by upper tiles, in a's dtype,
    each entry rounded once from fp32; `tile`, `tile_k` default to TILE, TILE_K and `variant` to the `variant`
    scope's, else VARIANT (read at the call; see `resolve` for its fallbacks); `warps`, `stages` override the
    variant's launch. Counted in the current counting scope (optimizers/counters.py)."""
    tile, tile_k = tile or TILE, tile_k or TILE_K
    if not usable(a) or b.dtype != a.dtype or (input is not None and input.dtype != a.dtype):
        raise ValueError(f"the Triton symmetric product takes {DTYPES} on CUDA (or the interpreter), got "
                         f"{a.dtype} on {a.device}")
    batch, m, k = a.shape
    if b.shape != (batch, k, m) or (input is not None and input.shape != (batch, m, m)):
        raise ValueError(f"shapes {tuple(a.shape)} @ {tuple(b.shape)} (+ {None if input is None else tuple(input.shape)}) "
                         f"do not make a stack of square products")
    name = resolve(variant, input, a, b, tile, tile_k)
    out = torch.empty(batch, m, m, dtype=a.dtype, device=a.device)
    try:
        _launch(VARIANTS[name], input, a, b, out, alpha, beta, tile, tile_k, warps, stages, identity)
    except Exception as e:  # noqa: BLE001 - triton's compile and launch errors have no common base
        if variant is not None or _CHOSEN.get() is not None or name == "base":
            raise  # asked for by name (benchmarks, tests): the failure is the answer
        # the default variant cannot compile or launch with this triton (shared memory, an unsupported
        # layout): warn once, and run the base kernel from now on
        BROKEN[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        warnings.warn(f"symmetric_triton: variant {name!r} failed ({BROKEN[name]}); running 'base'", stacklevel=2)
        name = "base"
        _launch(VARIANTS[name], input, a, b, out, alpha, beta, tile, tile_k, warps, stages, identity)
    stats = counters.current()
    if stats is not None:
        stats.products += 1
        stats.variants[name] = stats.variants.get(name, 0) + 1
    return out


def _launch(v: Variant, input, a, b, out, alpha, beta, tile, tile_k, warps, stages, identity) -> None:
    fn, grid, args, constexprs = launch_plan(v, input, a, b, out, alpha, beta, tile, tile_k, identity)
    extra = {} if interpreted() else dict(num_warps=warps or v.warps or WARPS,
                                          num_stages=stages or v.stages or STAGES)
    launch(fn, grid, *args, **constexprs, **extra)


def launch_plan(v: Variant, input, a, b, out, alpha=1.0, beta=1.0, tile=None, tile_k=None, identity=0.0):
    """(kernel, grid, positional arguments, constexpr keywords) that run variant `v` on these operands
    (resolved: `v` must suit them). Also what benchmarks/symmetric_kernel.py --compile-only compiles,
    with meta tensors."""
    tile, tile_k = tile or TILE, tile_k or TILE_K
    batch, m, k = a.shape
    if not v.descriptors:
        c = out if input is None else input
        pairs = _pairs(triton.cdiv(m, tile), a.device)
        args = (a, b, c, out, pairs, m, k, *a.stride(), *b.stride(), *c.stride(), *out.stride(), float(alpha),
                float(beta), float(identity))
        return _upper_tiles, (pairs.shape[0], batch), args, dict(HAS_C=input is not None, TILE_M=tile,
                                                                   TILE_R=tile_k, EVEN=v.even,
                                                                   HAS_IDENTITY=identity != 0.0)
    a_t, b_t = _by_columns(a), _by_columns(b)
    desc = _TensorDescriptor
    if a_t:
        at = a.mT
        a_desc = desc(at, list(at.shape), list(at.stride()), [1, tile_k, tile])
    else:
        a_desc = desc(a, list(a.shape), list(a.stride()), [1, tile, tile_k])
    if b_t:
        bt = b.mT
        b_desc = desc(bt, list(bt.shape), list(bt.stride()), [1, tile, tile_k])
    else:
        b_desc = desc(b, list(b.shape), list(b.stride()), [1, tile_k, tile])
    out_desc = desc(out, list(out.shape), list(out.stride()), [1, tile, tile])
    c_desc = out_desc if input is None else desc(input, list(input.shape), list(input.stride()), [1, tile, tile])
    pairs = _pairs(triton.cdiv(m, tile), a.device, v.group)
    constexprs = dict(HAS_C=input is not None, A_T=a_t, B_T=b_t, TILE_M=tile, TILE_R=tile_k,
                      HAS_IDENTITY=identity != 0.0)
    if v.persistent:
        work = pairs.shape[0] * batch
        args = (a_desc, b_desc, c_desc, out_desc, out, pairs, k, pairs.shape[0], work, float(alpha), float(beta),
                float(identity))
        return _upper_tiles_persistent, (min(work, programs(a.device)),), args, constexprs
    args = (a_desc, b_desc, c_desc, out_desc, out, pairs, k, float(alpha), float(beta), float(identity))
    return _upper_tiles_tma, (pairs.shape[0], batch), args, constexprs


INTERPRETED_PROGRAMS = 3
"""Programs of a persistent launch off a GPU (the interpreter; a rehearsal's meta tensors, whose grid is
not compiled): few, so that each takes several work items, as on a GPU."""


def programs(device: torch.device) -> int:
    """Programs of a persistent launch on `device`: one per SM on CUDA, else INTERPRETED_PROGRAMS."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETED_PROGRAMS
