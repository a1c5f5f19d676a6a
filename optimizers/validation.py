"""Checks that run before an optimizer changes any parameter or state.

Each raises ValueError (bad value) or TypeError (bad kind) with a message that
names the group, the option and what was expected.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

PARAM_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def check_real(where: str, name: str, value: Any, low: float = -math.inf, high: float = math.inf,
               high_open: bool = False) -> None:
    """`value` is a finite real number in [low, high] (or [low, high) with high_open)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}: {name} must be a real number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{where}: {name} must be finite, got {value!r}")
    if value < low or value > high or (high_open and value == high):
        bound = f"[{low}, {high})" if high_open else f"[{low}, {high}]"
        raise ValueError(f"{where}: {name}={value!r} is outside {bound}")


def check_params(where: str, params: Iterable[torch.Tensor], min_ndim: int) -> None:
    """Every parameter is a real floating tensor of a supported dtype and >= min_ndim dims."""
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"{where}: parameter {i} is a {type(p).__name__}, not a tensor")
        if p.is_complex() or not p.is_floating_point() or p.dtype not in PARAM_DTYPES:
            raise TypeError(f"{where}: parameter {i} has dtype {p.dtype}; supported: "
                            f"{[str(d) for d in PARAM_DTYPES]}")
        if p.ndim < min_ndim:
            raise ValueError(f"{where}: parameter {i} has shape {tuple(p.shape)}; a matrix algorithm needs "
                             f"2+ dims (put 1-D, scalar and embedding parameters in an 'adamw' group)")


def check_grad(where: str, index: int, p: torch.Tensor) -> None:
    """A gradient the optimizer can use: dense, of its parameter's dtype, device and shape, a DTensor
    with the parameter's placements exactly when the parameter is one."""
    g, at = p.grad, f"{where}: parameter {index}"
    if g.layout != torch.strided:
        raise TypeError(f"{at}: sparse gradients ({g.layout}) are not supported")
    if g.dtype != p.dtype:
        raise TypeError(f"{at}: gradient dtype {g.dtype} != parameter dtype {p.dtype}")
    if g.device != p.device:
        raise ValueError(f"{at}: gradient on {g.device}, parameter on {p.device}")
    if g.shape != p.shape:
        raise ValueError(f"{at}: gradient shape {tuple(g.shape)} != parameter shape {tuple(p.shape)}")
    if isinstance(g, DTensor) != isinstance(p, DTensor) or \
            (isinstance(p, DTensor) and tuple(g.placements) != tuple(p.placements)):
        got = tuple(g.placements) if isinstance(g, DTensor) else "a plain tensor"
        want = tuple(p.placements) if isinstance(p, DTensor) else "a plain tensor"
        raise ValueError(f"{at}: gradient placements {got} != parameter placements {want}")


def check_layouts(where: str, params: Iterable[torch.Tensor], group: dist.ProcessGroup | None,
                  check_layout: Callable[[str, int, torch.Tensor], None]) -> None:
    """Every parameter lies in a layout distributed Muon supports: a plain tensor (single process,
    or replicated over `group`), or a DTensor on a mesh of `group`'s size placed Shard(d) or
    Replicate() on each mesh dim (also FSDP2's _StridedShard(d) on a mesh of 2+ dims) (a mesh of 2+ dims, e.g. FSDP2 x TP: optimizers/tensor_parallel.py).
    A DTensor needs a group; Partial placements, and parameters sharded on two dims of a 1-D mesh,
    are rejected; then `check_layout(where, i, p)`, the algorithm's own rule."""
    for i, p in enumerate(params):
        if not isinstance(p, DTensor):
            continue
        placements = tuple(p.placements)
        if group is None:
            raise ValueError(f"{where}: parameter {i} is a DTensor {placements}; pass Muon(mesh=...) "
                             f"(its DeviceMesh or ProcessGroup) for distributed parameters")
        for placement in placements:  # a 1-D exchange cuts torch.chunk pieces: no _StridedShard there
            if type(placement) not in ((Shard, _StridedShard, Replicate) if p.device_mesh.ndim > 1
                                       else (Shard, Replicate)):
                raise ValueError(f"{where}: parameter {i} has placement {placement}; supported: Shard(d), "
                                 f"Replicate()")
        check_layout(where, i, p)
        if p.device_mesh.size() != dist.get_world_size(group):
            raise ValueError(f"{where}: parameter {i} lives on a mesh of {p.device_mesh.size()} ranks, "
                             f"the optimizer's mesh has {dist.get_world_size(group)}")
