"""Muon's elementwise passes by the fused Triton kernels of optimizers/elementwise_triton.py, where they can run.

Where the call's `kernels` allow (optimizers/kernels.py: a group's `fused` option; by default from
`MIN_NUMEL` elements a launch, on CUDA with triton installed), over fp32 parameters, buffers and gradients,
contiguous, on CUDA (or on CPU under Triton's interpreter); the normaliser's overflow-safe cast
(`scaled_and_cast`) at every size, over fp32 or bf16 stacks. Each function returns False (or None),
having done nothing, where the kernels cannot run, and the caller runs its torch passes instead.
"""

from __future__ import annotations

import struct
from types import ModuleType

import torch

from optimizers.kernels import Kernels
from optimizers.launches import on_device
from optimizers.optional import interpreted, triton_module

MIN_NUMEL = 1 << 23
"""Elements of one launch from which it takes the fused kernels under fused=None (optimizers/kernels.py): the
crossover `benchmarks/kernel_thresholds.py --elementwise` measured on an H200 (torch 2.11, triton 3.6), from
which the momentum, apply and divide kernels are each at least as fast as the torch passes (1.34x, 1.20x and
1.20x at 2^23 elements; 0.47x, 0.50x and 0.63x at 2^22, where a launch costs the host more than it saves)."""


def triton_kernels() -> ModuleType | None:
    """optimizers.elementwise_triton, or None where triton cannot be imported (optimizers/optional.py)."""
    return triton_module("elementwise_triton")


def _reached(t: torch.Tensor) -> bool:
    """The kernels can address `t`: CUDA, a meta tensor standing in for one (optimizers/launches.py), or CPU under
    the interpreter."""
    return on_device(t) or (t.device.type == "cpu" and interpreted())


def _dense_stack(x: torch.Tensor) -> bool:
    """x is a non-empty stack [B, m, n] whose matrices are dense blocks of their own, each row- or column-major."""
    if x.ndim != 3:
        return False
    batch, rows, cols = x.shape  # (sizes and strides only: indexing a view costs the host microseconds)
    strides = x.stride()
    return batch * rows * cols > 0 and strides[0] == rows * cols and (
        strides[1:] == (cols, 1) or strides[1:] == (1, rows))


def _usable(tensors: list[torch.Tensor], numel: int, kernels: Kernels, contiguous: bool = True,
            dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> ModuleType | None:
    """The kernels' module, when `kernels` allow a launch of `numel` elements (from MIN_NUMEL where sized), and
    every tensor is of `dtypes` (contiguous, if asked), one the kernels can address (CUDA, a meta tensor standing
    in for one (optimizers/launches.py), or CPU under the interpreter), on one device; else None."""
    if not kernels.on or not tensors or (kernels.sized and numel < MIN_NUMEL):
        return None
    module = triton_kernels()
    if module is None:
        return None
    device = tensors[0].device
    ok = _reached(tensors[0]) and all(
        t.dtype in dtypes and t.device == device and (t.is_contiguous() or not contiguous) for t in tensors)
    return module if ok else None


def applies(params: list[torch.Tensor], kernels: Kernels) -> bool:
    """True when `apply_` runs the fused kernel on these parameters under `kernels` (given matrices it takes)."""
    return _usable(params, sum(p.numel() for p in params), kernels) is not None


def momentum_(bufs: list[torch.Tensor], grads: list[torch.Tensor], mu: float, kernels: Kernels) -> torch.Tensor | None:
    """M <- mu M + G for every pair in one launch (the bits of `mul_` then `add_`), returning each new M's
    sum of squares in parts (elementwise_triton.momentum_; `norms` sums them); None: not run."""
    module = _usable(bufs + grads, sum(b.numel() for b in bufs), kernels)
    if module is None:
        return None
    return module.momentum_(bufs, grads, mu)


def norms(parts: torch.Tensor) -> torch.Tensor:
    """The Frobenius norms [N] fp64 of tensors whose sums of squares `momentum_` returned in parts [N, P]:
    the fp64 sum's square root (rounded to fp32, within 1.1e-7 of torch's fp32 norm of the same tensors at
    4096 x 4096, measured on an H200). Left in fp64, where no fp32 tensor's norm overflows (its squares are
    at most 2^256): the normaliser scales it into fp32's range (gram_newton_schulz.normalised)."""
    return parts.sum(1).sqrt()


def apply_(params: list[torch.Tensor], matrices: torch.Tensor, decay: float | None, alpha: float,
           kernels: Kernels) -> bool:
    """X <- X decay + alpha O for each parameter and its consecutive matrices of `matrices` [B, m, n]
    (bf16, fp16 or fp32, any strides; B a multiple of len(params)), in one launch: the bits of `mul_(decay)`
    then `add_(O, alpha=alpha)` on the parameter's matrix view (decay None: no product). False: not run."""
    module = _usable(params, sum(p.numel() for p in params), kernels)
    if (module is None or matrices.dtype not in (torch.float32, torch.bfloat16, torch.float16)
            or matrices.device != params[0].device or matrices.size(0) % len(params)
            or any(p.numel() != matrices[0].numel() * (matrices.size(0) // len(params)) for p in params)):
        return False
    module.apply_(params, matrices, decay, alpha)
    return True


def divide(x: torch.Tensor, denominators: torch.Tensor, dtype: torch.dtype, kernels: Kernels,
           factors: torch.Tensor | None = None) -> torch.Tensor | None:
    """x / d per matrix, rounded to `dtype` (bf16/fp16), as `torch.div(x, d, out=torch.empty_like(x, dtype=dtype))`
    rounds it (the quotient of the two widened to fp32, correctly rounded), in one launch, for x [B, m, n] whose
    matrices are dense blocks (row- or column-major) and d [B, 1, 1], both fp32 or both of `dtype` (Polar Express's
    normaliser divides its cast by a denominator in the compute dtype: torch's broadcasting division ran at a third
    of the kernel's speed on the 24-layer set, docs/performance.md section 17); with `factors` f [B, 1, 1] (fp32 or
    fp64) and fp32 x, (x f) / d, x f rounded to fp32 first, the bits of `torch.mul(x, f, out=<fp32>)` then that
    division. None (nothing done) where the kernel cannot run (and to bf16 under Triton's CPU interpreter, whose
    bf16 conversion truncates: 499 of 1024 Gaussian values differed from round-to-nearest-even)."""
    if (not _dense_stack(x) or dtype not in (torch.bfloat16, torch.float16) or x.dtype not in (torch.float32, dtype)
            or denominators.dtype != x.dtype or denominators.numel() != x.size(0)):
        return None
    if factors is not None and (x.dtype != torch.float32 or factors.dtype not in (torch.float32, torch.float64)
                                or factors.numel() != x.size(0) or factors.device != x.device):
        return None
    module = _usable([x], x.numel(), kernels, contiguous=False, dtypes=(torch.float32, dtype))
    if module is None or (dtype == torch.bfloat16 and interpreted()):  # the interpreter truncates to bf16
        return None
    return module.divide(x, denominators, dtype, factors)


CAST_INPUTS = (torch.float32, torch.bfloat16)
CAST_OUTPUTS = (torch.bfloat16, torch.float16, torch.float32)
"""The stack and cast dtypes `scaled_and_cast` takes (an fp64 stack keeps the torch form: triton 3.6 refused to
compile the kernel for fp64 on an H200)."""

GRID_ROWS = 65535
"""Matrices of one stack at most: the launch grid's second dimension on CUDA."""


def _fp32_exact(value: float) -> bool:
    """`value` is a float that fp32 holds exactly (the kernels take a Python float argument in fp32)."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0] == value
    except OverflowError:
        return False


def scaled_and_cast(x: torch.Tensor, limit: float, dtype: torch.dtype, kernels: Kernels
                    ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(x scale rounded to `dtype`, scale [B, 1, 1] rounded to `dtype`), scale norms.scale_of(max |entry|, limit)
    per matrix of x [B, m, n], in one launch (elementwise_triton.scaled_and_cast), the bits and strides of
    norms.py's `downscale` then `torch.mul(x, scale, out=torch.empty_like(x, dtype=dtype))`; None (nothing done)
    where the kernel cannot run: `kernels` off, a dtype outside CAST_INPUTS / CAST_OUTPUTS, matrices that are not
    dense blocks, an empty stack, more than GRID_ROWS matrices, a limit fp32 does not hold exactly, or a CUDA graph's
    capture before the device's first launch of it (elementwise_triton.arrivals).
    At every size (no MIN_NUMEL): it takes the place of the torch form's ~7 launches and its second read of x.
    `benchmarks/normaliser_overhead.py --device cuda` on an H200 (torch 2.11, triton 3.6; docs/gpu-speed.md): per
    stack 0.03 to 0.1 ms faster than the torch form, 1.9x as fast on the 24-layer set's (8.08 against 15.28 ms
    for 96 x 4096 x 4096, where the plain cast took 8.38); Polar Express steps launch the kernels they launch with
    no overflow pass and cost 0.1% more on the 24-layer set, 0.0% to 0.8% on GPT-2 small and ConvNeXt-T with
    CUDA graphs."""
    if (not kernels.on or not _dense_stack(x) or x.dtype not in CAST_INPUTS or dtype not in CAST_OUTPUTS
            or x.size(0) > GRID_ROWS or not _fp32_exact(limit) or not _reached(x)):
        return None
    module = triton_kernels()
    counts = None if module is None else module.arrivals(x.device, x.size(0))
    return None if counts is None else module.scaled_and_cast(x, limit, dtype, counts)
