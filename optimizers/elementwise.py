"""Muon's elementwise passes by the fused Triton kernels of optimizers/elementwise_triton.py, where they can run.

Opt-in (`TRITON`, as optimizers/symmetric.py's kernel is): on CUDA with triton installed (or its CPU
interpreter), fp32 parameters, buffers and gradients, contiguous. Each function returns False, having done
nothing, where the kernels cannot run, and the caller runs its torch passes instead.
"""

from __future__ import annotations

from types import ModuleType

import torch

TRITON = False
"""Opt-in: Muon's momentum and apply passes over fp32 parameters run the fused kernels where they can;
benchmarks/gpu_step.py's "triton" rows and the harness's `ours-triton` target switch it on."""

_KERNEL: list[ModuleType | None] = []


def triton_kernels() -> ModuleType | None:
    """optimizers.elementwise_triton, or None where triton cannot be imported (imported once)."""
    if not _KERNEL:
        try:
            from optimizers import elementwise_triton  # noqa: PLC0415 - optional: needs triton
        except ImportError:
            elementwise_triton = None
        _KERNEL.append(elementwise_triton)
    return _KERNEL[0]


def _usable(tensors: list[torch.Tensor]) -> ModuleType | None:
    """The kernels, when TRITON is on and every tensor is a contiguous fp32 tensor the kernels can address
    (CUDA, or CPU under the interpreter) on one device; else None."""
    if not TRITON or not tensors:
        return None
    kernels = triton_kernels()
    if kernels is None:
        return None
    device = tensors[0].device
    on_device = device.type == "cuda" or (device.type == "cpu" and kernels.interpreted())
    ok = on_device and all(t.dtype == torch.float32 and t.device == device and t.is_contiguous() for t in tensors)
    return kernels if ok else None


def applies(params: list[torch.Tensor]) -> bool:
    """True when `apply_` runs the fused kernel on these parameters (given matrices it takes)."""
    return _usable(params) is not None


def momentum_(bufs: list[torch.Tensor], grads: list[torch.Tensor], mu: float) -> bool:
    """M <- mu M + G for every pair in one launch (the bits of `mul_` then `add_`); False: not run."""
    kernels = _usable(bufs + grads)
    if kernels is None:
        return False
    kernels.momentum_(bufs, grads, mu)
    return True


def apply_(params: list[torch.Tensor], matrices: torch.Tensor, decay: float | None, alpha: float) -> bool:
    """X <- X decay + alpha O for each parameter and its consecutive matrices of `matrices` [B, m, n]
    (bf16, fp16 or fp32, any strides; B a multiple of len(params)), in one launch: the bits of `mul_(decay)`
    then `add_(O, alpha=alpha)` on the parameter's matrix view (decay None: no product). False: not run."""
    kernels = _usable(params)
    if (kernels is None or matrices.dtype not in (torch.float32, torch.bfloat16, torch.float16)
            or matrices.device != params[0].device or matrices.size(0) % len(params)
            or any(p.numel() != matrices[0].numel() * (matrices.size(0) // len(params)) for p in params)):
        return False
    kernels.apply_(params, matrices, decay, alpha)
    return True
