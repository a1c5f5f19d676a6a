"""A parameter's state: created from its algorithm's state keys, and checked against its parameter:
live state before every step, loaded state before a checkpoint is accepted (one rule for both).

A parameter's state is empty (created on its first step) or holds exactly its algorithm's keys:
a step count is a non-negative int; every other entry is a tensor shaped as the key says, placed
like the parameter (a DTensor on the same mesh with the same placements exactly when the
parameter is one), on the parameter's device and in its dtype (a loaded state: any real floating
dtype, which torch's load casts to the parameter's).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor

from optimizers import distributed
from optimizers.algorithms import Algorithm


def create(p: torch.Tensor, state: dict[str, Any], algorithm: Algorithm, group: dict[str, Any]) -> dict[str, Any]:
    """Add `algorithm`'s missing keys to `p`'s `state` as zeros placed like `p` (a step count as 0)."""
    for key in algorithm.state:
        if key.name not in state:
            state[key.name] = 0 if key.shape is None else \
                distributed.zeros_placed_like(p, key.shape(tuple(p.shape), group))
    return state


def check(where: str, p: torch.Tensor, entry: Any, algorithm: Algorithm, group: dict[str, Any],
          loaded: bool = False) -> None:
    """ValueError naming `where` and the key unless `entry` is a state `p` may hold (module docstring).
    `loaded`: a state from a checkpoint: any real floating dtype, and finite values (non-negative
    for a key marked so)."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: state is a {type(entry).__name__}, not a dict")
    if not entry:
        return
    expected = [key.name for key in algorithm.state]
    missing, extra = sorted(set(expected) - set(entry)), sorted(map(str, set(entry) - set(expected)))
    if missing or extra:
        problems = ([f"lacks {missing}"] if missing else []) + ([f"has extra keys {extra}"] if extra else [])
        raise ValueError(f"{where}: state {' and '.join(problems)}; algorithm {algorithm.name!r} keeps "
                         f"{sorted(expected)}")
    for key in algorithm.state:
        value, at = entry[key.name], f"{where}: {key.name}"
        if key.shape is None:
            if type(value) is not int or value < 0:
                raise ValueError(f"{at} must be a non-negative int step count, got {value!r}")
            continue
        _check_tensor(at, p, value, key.shape(tuple(p.shape), group), loaded)
        if loaded and not _finite(value, key.nonnegative):
            bound = "finite and >= 0" if key.nonnegative else "finite"
            raise ValueError(f"{at} has values that are not {bound}")


def _check_tensor(at: str, p: torch.Tensor, value: Any, shape: tuple[int, ...], loaded: bool) -> None:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{at} is a {type(value).__name__}, not a tensor")
    if isinstance(value, DTensor) != isinstance(p, DTensor):
        kind = "a DTensor" if isinstance(value, DTensor) else "a plain tensor"
        raise ValueError(f"{at} is {kind}, its parameter {'is' if isinstance(p, DTensor) else 'is not'} a DTensor")
    if isinstance(p, DTensor) and (value.device_mesh != p.device_mesh
                                   or tuple(value.placements) != tuple(p.placements)):
        raise ValueError(f"{at} is placed {tuple(value.placements)} on {value.device_mesh}, its parameter "
                         f"{tuple(p.placements)} on {p.device_mesh}")
    if tuple(value.shape) != shape:
        raise ValueError(f"{at} has shape {tuple(value.shape)}, expected {shape}")
    if loaded:
        if not value.is_floating_point():
            raise ValueError(f"{at} has dtype {value.dtype}, not a real floating dtype")
        return
    if value.dtype != p.dtype or value.device != p.device:
        raise ValueError(f"{at} is {value.dtype} on {value.device}, its parameter {p.dtype} on {p.device}")


def _finite(value: torch.Tensor, nonnegative: bool) -> bool:
    data = distributed.local(value)
    return bool(torch.isfinite(data).all()) and not (nonnegative and bool((data < 0).any()))
