"""What a parameter group is: its algorithm record, its options with defaults filled in, and the one
validator that live groups (at construction and every step) and saved groups (checkpoints) share."""

from __future__ import annotations

from typing import Any

from optimizers import kernels
from optimizers.algorithms import Algorithm, resolve
from optimizers.validation import check_real


def filled(index: int, defaults: dict[str, Any], group: dict[str, Any]) -> dict[str, Any]:
    """`group` with missing options taken from the optimizer's `defaults`, then from its algorithm
    record's defaults (options the optimizer does not name, e.g. those of an added algorithm).
    Raises ValueError for an unknown algorithm."""
    algorithm = resolve(f"param group {index}", group.get("algorithm", defaults["algorithm"]))
    return {**algorithm.defaults, **defaults, **group}


SCALARS = ("lr", "weight_decay")
"""The options every algorithm has: scalars that shape nothing (no state, no plan), so they are checked
on every step (schedulers change them) and left out of the plan's cache key (optimizers/plan.py)."""


def check_scalars(index: int, group: dict[str, Any]) -> None:
    """lr and weight_decay are finite and >= 0."""
    for name in SCALARS:
        check_real(f"param group {index}", name, group[name], 0.0)


EXECUTION = ("fused", "cuda_graphs")
"""The options every group has that choose how its step runs (optimizers/muon.py's Args): `fused`, the Triton
kernels (optimizers/kernels.py); `cuda_graphs`, one CUDA graph per plan (optimizers/graphs.py)."""


def check_execution(index: int, group: dict[str, Any]) -> None:
    """fused is None or a bool, and with True the kernels reach every parameter (kernels.check); cuda_graphs is
    None or a bool."""
    where = f"param group {index}"
    kernels.check(where, group["fused"], group["params"])
    if not (group["cuda_graphs"] is None or isinstance(group["cuda_graphs"], bool)):
        raise TypeError(f"{where}: cuda_graphs must be None, True or False, got {group['cuda_graphs']!r}")


def check_group(index: int, group: dict[str, Any]) -> Algorithm:
    """Validate one parameter group with its defaults filled in; returns its algorithm record."""
    where = f"param group {index}"
    algorithm = resolve(where, group.get("algorithm"))
    check_scalars(index, group)
    algorithm.validate(where, group)
    check_execution(index, group)
    return algorithm
