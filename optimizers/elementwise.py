"""Muon's elementwise passes by the fused Triton kernels of optimizers/elementwise_triton.py, where they can run.

Where the call's `kernels` allow (optimizers/kernels.py: a group's `fused` option; by default from
`MIN_NUMEL` elements a launch, on CUDA with triton installed), over fp32 parameters, buffers and gradients,
contiguous, on CUDA (or on CPU under Triton's interpreter). Each function returns False (or None), having
done nothing, where the kernels cannot run, and the caller runs its torch passes instead.
"""

from __future__ import annotations

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


def _usable(tensors: list[torch.Tensor], numel: int, kernels: Kernels, contiguous: bool = True) -> ModuleType | None:
    """The kernels' module, when `kernels` allow a launch of `numel` elements (from MIN_NUMEL where sized), and
    every tensor is an fp32 tensor (contiguous, if asked) the kernels can address (CUDA, a meta tensor standing
    in for one (optimizers/launches.py), or CPU under the interpreter) on one device; else None."""
    if not kernels.on or not tensors or (kernels.sized and numel < MIN_NUMEL):
        return None
    module = triton_kernels()
    if module is None:
        return None
    device = tensors[0].device
    here = on_device(tensors[0]) or (device.type == "cpu" and interpreted())
    ok = here and all(t.dtype == torch.float32 and t.device == device and (t.is_contiguous() or not contiguous)
                      for t in tensors)
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


def divide(x: torch.Tensor, denominators: torch.Tensor, dtype: torch.dtype, kernels: Kernels) -> torch.Tensor | None:
    """x / d per matrix, rounded to `dtype` (bf16/fp16), as `torch.div(x, d, out=torch.empty_like(x, dtype=dtype))`
    rounds it, in one launch, for fp32 x [B, m, n] whose matrices are dense blocks (row- or column-major) and
    d [B, 1, 1]; None (nothing done) where the kernel cannot run (and to bf16 under Triton's CPU interpreter,
    whose bf16 conversion truncates: 499 of 1024 Gaussian values differed from round-to-nearest-even)."""
    dense = x.ndim == 3 and x.numel() > 0 and x.stride(0) == x[0].numel() and (
        x.stride()[1:] == (x.size(2), 1) or x.stride()[1:] == (1, x.size(1)))
    if (not dense or dtype not in (torch.bfloat16, torch.float16) or denominators.dtype != torch.float32
            or denominators.numel() != x.size(0)):
        return None
    module = _usable([x], x.numel(), kernels, contiguous=False)
    if module is None or (dtype == torch.bfloat16 and interpreted()):  # the interpreter truncates to bf16
        return None
    return module.divide(x, denominators, dtype)
