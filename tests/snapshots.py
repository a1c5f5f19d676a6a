"""Optimizer snapshots, and the checkpoint-safety check built on them: a rejected `load_state_dict`
must leave the optimizer exactly as it was.

`snapshot` records every parameter and gradient, every state entry of every parameter and every
param group (options and parameter identities); `differences` lists what changed between two.
`rejected_load_problems` is the check; tests run it against NorMuon and against a negative
control that mutates its state before failing, and tests/test_atomicity.py uses the snapshots
for failing steps.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.distributed.tensor import DTensor


def _same(a: Any, b: Any) -> bool:
    """Equal in type, dtype, shape, placements and every bit of value (NaN equal to NaN)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and type(a) is type(b)
                and a.dtype == b.dtype and a.shape == b.shape and a.layout == b.layout):
            return False
        if isinstance(a, DTensor):
            return (a.device_mesh == b.device_mesh and a.placements == b.placements
                    and _same(a.to_local(), b.to_local()))
        return a.layout != torch.strided or (torch.equal(a.isnan(), b.isnan())
                                             and torch.equal(a.nan_to_num(), b.nan_to_num()))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and (a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))


def _copy(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, (list, tuple)):
        return type(v)(_copy(x) for x in v)
    return v


def snapshot(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Every parameter and gradient (values, dtype, shape, placements), every state entry (keyed by
    the parameter's position over all groups) and every group's options and parameter identities."""
    params = [p for g in opt.param_groups for p in g["params"]]
    position = {id(p): i for i, p in enumerate(params)}
    return {
        "params": [_copy(p) for p in params],
        "grads": [None if p.grad is None else _copy(p.grad) for p in params],
        "state": {position.get(id(p), f"id {id(p)}"): {k: _copy(v) for k, v in s.items()}
                  for p, s in opt.state.items()},
        "groups": [{k: [id(p) for p in v] if k == "params" else _copy(v) for k, v in g.items()}
                   for g in opt.param_groups],
    }


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What changed between two snapshots, one readable line per change (empty: nothing)."""
    found = []
    for kind in ("params", "grads"):
        if len(before[kind]) != len(after[kind]):
            found.append(f"the number of {kind} changed")
        found += [f"{kind[:-1]} {i} changed" for i, (a, b) in enumerate(zip(before[kind], after[kind]))
                  if not _same(a, b)]
    if set(before["state"]) != set(after["state"]):
        found.append("the set of parameters with a state entry changed")
    for key, entry in before["state"].items():
        new = after["state"].get(key, {})
        if set(entry) != set(new):
            found.append(f"state keys of parameter {key} changed: {sorted(entry)} -> {sorted(new)}")
        found += [f"state {name!r} of parameter {key} changed" for name in entry
                  if name in new and not _same(entry[name], new[name])]
    if len(before["groups"]) != len(after["groups"]):
        found.append("the number of param groups changed")
    for i, (a, b) in enumerate(zip(before["groups"], after["groups"])):
        found += [f"param group {i} option {k!r} changed" for k in sorted(set(a) | set(b))
                  if k not in a or k not in b or not _same(a[k], b[k])]
    return found


def rejected_load_problems(optimizer: torch.optim.Optimizer, bad_state: dict[str, Any]) -> list[str]:
    """Load `bad_state`, which must be refused; return what went wrong (empty when all is well):
    the load did not raise ValueError, or anything of the optimizer changed (`differences`)."""
    before = snapshot(optimizer)
    problems = []
    try:
        optimizer.load_state_dict(bad_state)
        problems.append("the load was accepted")
    except ValueError:
        pass
    return problems + differences(before, snapshot(optimizer))
