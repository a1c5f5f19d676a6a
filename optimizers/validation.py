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

PARAM_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
COMPUTE_DTYPES = (None, torch.float64, torch.float32, torch.bfloat16, torch.float16)


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


def check_grad(where: str, p: torch.Tensor) -> None:
    """A gradient Muon can use: dense, real, same shape (and DTensor placements) as its parameter."""
    g = p.grad
    if g.is_sparse:
        raise TypeError(f"{where}: sparse gradients are not supported")
    if g.is_complex():
        raise TypeError(f"{where}: complex gradients are not supported")
    if g.shape != p.shape:
        raise ValueError(f"{where}: gradient shape {tuple(g.shape)} != parameter shape {tuple(p.shape)}")
    if isinstance(p, DTensor) and (not isinstance(g, DTensor) or tuple(g.placements) != tuple(p.placements)):
        got = tuple(g.placements) if isinstance(g, DTensor) else "a plain tensor"
        raise ValueError(f"{where}: gradient placements {got} != parameter placements {tuple(p.placements)}")


def check_layouts(where: str, params: Iterable[torch.Tensor], group: dist.ProcessGroup | None,
                  check_layout: Callable[[str, int, torch.Tensor], None]) -> None:
    """Every parameter lies in a layout distributed Muon supports: a plain tensor (single process,
    or replicated over `group`), or a DTensor on a 1-D mesh of `group`'s size placed Shard(d) or
    Replicate(). A DTensor needs a group; 2-D meshes, Partial placements and parameters sharded
    on two dims are rejected; then `check_layout(where, i, p)`, the algorithm's own rule."""
    for i, p in enumerate(params):
        if not isinstance(p, DTensor):
            continue
        placements = tuple(p.placements)
        if group is None:
            raise ValueError(f"{where}: parameter {i} is a DTensor {placements}; pass Muon(mesh=...) "
                             f"(its 1-D DeviceMesh or ProcessGroup) for distributed parameters")
        sharded = sorted(pl.dim for pl in placements if isinstance(pl, Shard))
        if len(sharded) > 1:
            raise ValueError(f"{where}: parameter {i} of shape {tuple(p.shape)} is sharded on dims {sharded} "
                             f"({placements}); only one sharded dim is supported")
        if p.device_mesh.ndim != 1:
            raise ValueError(f"{where}: parameter {i} lives on a {p.device_mesh.ndim}-D DeviceMesh "
                             f"{tuple(p.device_mesh.shape)}; only 1-D meshes are supported")
        (placement,) = placements
        if type(placement) not in (Shard, Replicate):
            raise ValueError(f"{where}: parameter {i} has placement {placement}; supported: Shard(d), Replicate()")
        check_layout(where, i, p)
        if p.device_mesh.size() != dist.get_world_size(group):
            raise ValueError(f"{where}: parameter {i} lives on a mesh of {p.device_mesh.size()} ranks, "
                             f"the optimizer's mesh has {dist.get_world_size(group)}")
