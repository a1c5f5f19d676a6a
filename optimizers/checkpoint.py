"""Versioned optimizer-state layout: what a checkpoint must hold, checked before loading.

LAYOUT_VERSION names the state layout of Muon/NorMuon:
  1  (legacy, never written by this package) NorMuon variance shaped param[..., 0:1]
  2  per parameter, the state keys of its group's algorithm record (optimizers/algorithms/):
     Muon "momentum_buffer" (parameter shape); NorMuon also "variance", one value per output
     channel at parameter rank; AdamW "step", "exp_avg", "exp_avg_sq".
A state of another version, with missing keys or wrong shapes, or whose version is not an
integer, is rejected with ValueError before any live state is touched. A legacy state whose
shapes happen to coincide (kernel 1x1) is still rejected by its version.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

from optimizers.algorithms import resolve

LAYOUT_VERSION = 2
VERSION_KEY = "layout_version"


def as_version(value: Any) -> int:
    """The integer layout version stored as an int, a NumPy integer or a 0-d integer tensor."""
    if isinstance(value, torch.Tensor) and value.ndim == 0 and not value.is_floating_point() \
            and value.dtype != torch.bool:
        return int(value.item())
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"optimizer state: {VERSION_KEY} must be an integer, got {value!r} "
                         f"({type(value).__name__})")
    return int(value)


def expected_state(p: torch.Tensor, group: dict[str, Any]) -> dict[str, tuple[int, ...] | None]:
    """State keys of parameter `p` in `group`, with the tensor shape each must have (None: scalar)."""
    algorithm = resolve("optimizer state", group["algorithm"])
    return {key.name: None if key.shape is None else key.shape(tuple(p.shape), group) for key in algorithm.state}


def validate(state_dict: dict[str, Any], live_groups: list[dict[str, Any]]) -> None:
    """Raise ValueError unless `state_dict` is a state of LAYOUT_VERSION for these parameter groups."""
    if VERSION_KEY not in state_dict:
        raise ValueError(f"optimizer state has no {VERSION_KEY}: a legacy layout, which this version "
                         f"cannot load (restart the optimizer from the model weights)")
    version = as_version(state_dict[VERSION_KEY])
    if version != LAYOUT_VERSION:
        raise ValueError(f"optimizer state has layout version {version}; this optimizer reads {LAYOUT_VERSION}")
    saved_groups = state_dict.get("param_groups")
    if not isinstance(saved_groups, list) or len(saved_groups) != len(live_groups):
        raise ValueError("optimizer state: param_groups missing or of a different count")
    state = state_dict.get("state")
    if not isinstance(state, dict):
        raise ValueError("optimizer state: 'state' missing")
    for index, (saved, live) in enumerate(zip(saved_groups, live_groups)):
        if len(saved["params"]) != len(live["params"]):
            raise ValueError(f"optimizer state: param group {index} has {len(saved['params'])} parameters, "
                             f"the optimizer {len(live['params'])}")
        for key, p in zip(saved["params"], live["params"]):
            if key in state:
                _validate_param(state[key], expected_state(p, {**live, **saved}), f"group {index} parameter {key}")


def _validate_param(entry: dict[str, Any], expected: dict[str, tuple[int, ...] | None], where: str) -> None:
    missing = sorted(set(expected) - set(entry))
    if missing:
        raise ValueError(f"optimizer state for {where} lacks {missing}")
    for key, shape in expected.items():
        if shape is not None and tuple(torch.as_tensor(entry[key]).shape) != shape:
            raise ValueError(f"optimizer state for {where}: {key} has shape {tuple(torch.as_tensor(entry[key]).shape)}, "
                             f"expected {shape} (a state of another layout?)")
