"""Checkpoint safety: a rejected `load_state_dict` must leave the optimizer exactly as it was.

`rejected_load_problems` is the check; tests run it against NorMuon and against a negative
control that mutates its state before failing.
"""

from __future__ import annotations

from typing import Any

import torch


def _snapshot(optimizer: torch.optim.Optimizer) -> dict[int, dict[str, Any]]:
    return {id(p): {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
            for p, s in optimizer.state.items()}


def rejected_load_problems(optimizer: torch.optim.Optimizer, bad_state: dict[str, Any]) -> list[str]:
    """Load `bad_state`, which must be refused; return what went wrong (empty when all is well):
    the load did not raise ValueError, or the live state or hyper-parameters changed."""
    before, groups = _snapshot(optimizer), [{k: v for k, v in g.items() if k != "params"}
                                              for g in optimizer.param_groups]
    problems = []
    try:
        optimizer.load_state_dict(bad_state)
        problems.append("the load was accepted")
    except ValueError:
        pass
    after = _snapshot(optimizer)
    if set(after) != set(before):
        problems.append("the set of parameters with state changed")
    for key, state in before.items():
        for name, value in state.items():
            new = after.get(key, {}).get(name)
            same = torch.equal(value, new) if isinstance(value, torch.Tensor) else value == new
            if not same:
                problems.append(f"state {name!r} of a parameter changed")
    if [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups] != groups:
        problems.append("hyper-parameters changed")
    return problems
