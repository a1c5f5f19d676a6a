"""Which Triton kernels a call takes: a group's `fused` option, resolved for the tensors at hand.

Muon's stages take the kernels of optimizers/symmetric_triton.py (symmetric products of bf16/fp16 stacks) and
optimizers/elementwise_triton.py (the momentum, apply and normaliser passes over fp32 tensors) as the group's
`fused` option says, with torch.optim's conventions:

  fused=None   (the default) where they are correct and faster: on CUDA with triton installed, a product of at
               least symmetric.TRITON_ROWS rows (symmetric.GRAPHED_ROWS in a megabatch a CUDA graph records:
               `in_graph`), an elementwise launch of at least elementwise.MIN_NUMEL elements; nowhere else (a
               CPU, no triton), so that there the step is the torch step, bit for bit
  fused=True   wherever they compute, at any size: on CUDA, or on CPU under Triton's interpreter
               (TRITON_INTERPRET=1); a group whose parameters they cannot reach (no triton, a parameter on
               another device) is refused before any write (`check`)
  fused=False  nowhere

Each kernel still takes only what it computes (bf16/fp16 products, contiguous fp32 elementwise passes); the rest
of the step runs its torch passes.
"""

from __future__ import annotations

import functools
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Iterable, TypeVar

import torch

from optimizers.launches import device_of
from optimizers.optional import interpreted, triton_module


@dataclass(frozen=True)
class Kernels:
    """Whether a call may take the Triton kernels (`on`), and only from their size thresholds (`sized`:
    symmetric.TRITON_ROWS rows, elementwise.MIN_NUMEL elements) or at any size; `graphed`: the call is part of a
    megabatch a CUDA graph records (`in_graph`), whose products take the kernel from symmetric.GRAPHED_ROWS."""

    on: bool = False
    sized: bool = True
    graphed: bool = False


TORCH = Kernels()
"""No kernel: the torch passes and cuBLAS products."""


def available() -> bool:
    """The kernel modules import (triton is installed)."""
    return triton_module("symmetric_triton") is not None and triton_module("elementwise_triton") is not None


def reaches(device: torch.device) -> bool:
    """The kernels run on `device`: CUDA, or CPU under Triton's interpreter."""
    return device.type == "cuda" or (device.type == "cpu" and interpreted())


_GRAPHED: ContextVar[bool] = ContextVar("optimizers.kernels.graphed", default=False)
"""Inside an `in_graph` call of this thread and context."""

F = TypeVar("F", bound=Callable[..., Any])


def in_graph(update: F) -> F:
    """`update`, whose calls take the kernels as a megabatch a CUDA graph records does (`Kernels.graphed`): the
    plan (optimizers/plan.py) wraps the update of each megabatch its graph captures, for its eager first step and
    its capture alike, so that both have the same bits."""
    @functools.wraps(update)
    def run(*args: Any, **kwargs: Any) -> Any:
        token = _GRAPHED.set(True)
        try:
            return update(*args, **kwargs)
        finally:
            _GRAPHED.reset(token)
    return run  # type: ignore[return-value]


def of(fused: bool | None, t: torch.Tensor) -> Kernels:
    """The kernels a call on `t` (or on a meta tensor standing in for it in a rehearsal: launches.device_of) takes
    under `fused` (module docstring)."""
    if fused is False:
        return TORCH
    device = device_of(t)
    if fused is None:
        return Kernels(on=True, graphed=_GRAPHED.get()) if device.type == "cuda" and available() else TORCH
    return Kernels(on=True, sized=False) if reaches(device) and available() else TORCH


def check(where: str, fused: Any, params: Iterable[torch.Tensor]) -> None:
    """TypeError unless `fused` is None or a bool; with fused=True, ValueError naming `where` unless triton imports
    and the kernels reach every parameter's device."""
    if not (fused is None or isinstance(fused, bool)):
        raise TypeError(f"{where}: fused must be None, True or False, got {fused!r}")
    if fused is not True:
        return
    if not available():
        raise ValueError(f"{where}: fused=True takes the Triton kernels, and triton cannot be imported here "
                         f"(pip install triton); fused=None takes them where they run, fused=False never")
    for i, p in enumerate(params):
        if not reaches(p.device):
            raise ValueError(f"{where}: fused=True takes the Triton kernels, which run on CUDA (or on CPU under "
                             f"TRITON_INTERPRET=1); parameter {i} is on {p.device}")
