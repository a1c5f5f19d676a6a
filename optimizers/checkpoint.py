"""Versioned optimizer-state layout: what a checkpoint must hold, checked before loading.

LAYOUT_VERSION names the state layout of Muon/NorMuon:
  1  (legacy, never written by this package) NorMuon variance shaped param[..., 0:1]
  2  per parameter, the state keys of its group's algorithm record (optimizers/algorithms/):
     Muon "momentum_buffer" (parameter shape); NorMuon also "variance", one value per output
     channel at parameter rank; AdamW "step", "exp_avg", "exp_avg_sq".
A state of another version or whose version is not an integer, of another algorithm, with
invalid group options, or with any state entry its parameter could not hold (keys, type,
placement, dtype, shape, non-finite values, negative second moments) is rejected with a
ValueError naming the group, parameter and key, before any live state is touched. A legacy
state whose shapes happen to coincide (kernel 1x1) is still rejected by its version.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from optimizers import state as param_state
from optimizers.algorithms import Algorithm, resolve
from optimizers.groups import check_group

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


def validate(state_dict: Any, live_groups: list[dict[str, Any]]) -> None:
    """Raise ValueError, naming the group, parameter and key, unless `state_dict` is a state of
    LAYOUT_VERSION for these parameter groups: the torch layout ("state", "param_groups", the
    version); each saved group's options valid under the same rules as a live group
    (optimizers.groups.check_group, on the live group updated with the saved options, which is
    the group the load leaves) and naming the live group's algorithm; its "params" a list of
    distinct integer ids, as many as the live group has; every state entry keyed by one of them
    and valid for its live parameter (optimizers.state.check, loaded: finite, second moments >= 0)."""
    if not isinstance(state_dict, Mapping):
        raise ValueError(f"optimizer state must be a dict, got a {type(state_dict).__name__}")
    if VERSION_KEY not in state_dict:
        raise ValueError(f"optimizer state has no {VERSION_KEY}: a legacy layout, which this version "
                         f"cannot load (restart the optimizer from the model weights)")
    version = as_version(state_dict[VERSION_KEY])
    if version != LAYOUT_VERSION:
        raise ValueError(f"optimizer state has layout version {version}; this optimizer reads {LAYOUT_VERSION}")
    unknown = sorted(map(str, set(state_dict) - {"state", "param_groups", VERSION_KEY}))
    if unknown:
        raise ValueError(f"optimizer state: unknown top-level keys {unknown}")
    saved_groups, state = state_dict.get("param_groups"), state_dict.get("state")
    if not isinstance(saved_groups, list) or len(saved_groups) != len(live_groups):
        count = len(saved_groups) if isinstance(saved_groups, list) else "no list of"
        raise ValueError(f"optimizer state: {count} param_groups, the optimizer has {len(live_groups)}")
    if not isinstance(state, Mapping):
        raise ValueError(f"optimizer state: 'state' must be a dict, got {type(state).__name__}")
    seen: set[int] = set()
    for index, (saved, live) in enumerate(zip(saved_groups, live_groups)):
        where = f"optimizer state: param group {index}"
        group = loaded_group(index, saved, live)
        algorithm = check_group_loaded(index, group)
        ids = saved["params"]
        for i, (key, p) in enumerate(zip(ids, live["params"])):
            if key in seen:
                raise ValueError(f"{where} parameter {i}: id {key!r} appears twice in param_groups")
            seen.add(key)
            if key in state:
                param_state.check(f"{where} parameter {i}", p, state[key], algorithm, group, loaded=True)
    strays = sorted(map(repr, set(state) - seen))
    if strays:
        raise ValueError(f"optimizer state: state entries {strays} belong to no parameter of param_groups")


def loaded_group(index: int, saved: Any, live: dict[str, Any]) -> dict[str, Any]:
    """The group a load leaves: the live group with the saved options (ValueError unless the saved
    group is a dict naming the live group's algorithm, with a list of as many integer ids)."""
    where = f"optimizer state: param group {index}"
    if not isinstance(saved, Mapping):
        raise ValueError(f"{where} is a {type(saved).__name__}, not a dict")
    ids = saved.get("params")
    if not isinstance(ids, list) or any(isinstance(k, bool) or not isinstance(k, int) for k in ids):
        raise ValueError(f"{where}: 'params' must be a list of integer ids, got {ids!r}")
    if len(ids) != len(live["params"]):
        raise ValueError(f"{where} has {len(ids)} parameters, the optimizer {len(live['params'])}")
    name = resolve(where, live["algorithm"]).name
    if saved.get("algorithm") != name:
        raise ValueError(f"{where}: saved algorithm {saved.get('algorithm')!r}, the optimizer's group runs "
                         f"{name!r} (a state of another algorithm)")
    return {**live, **{k: v for k, v in saved.items() if k != "params"}, "algorithm": live["algorithm"]}


def check_group_loaded(index: int, group: dict[str, Any]) -> Algorithm:
    """optimizers.groups.check_group, every problem a ValueError saying it is in the loaded state."""
    try:
        return check_group(index, group)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"optimizer state: {exc}") from exc
