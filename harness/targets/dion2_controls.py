"""Negative controls for Dion2 / NorDion2: our record with one stage replaced by a bug that a
public implementation had or that the harness must be able to see (tests/test_dion2_controls.py
proves each is flagged by the check meant to catch it).

  kernel_selection  selection over the kernel rows of an unflattened conv although the
                    update is flattened (dion's Dion2 before it rejected flatten=True)
  ef_unselected     error feedback applied to the unselected slices instead of the selected
  submatrix_lr      the lr scale of the selected submatrix [k, n] instead of the full view
  local_as_global   the local selection scope run where the case (and its oracle) says global
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from cases import Case
from harness.targets.controls import Control
from optimizers.algorithms.base import Group, State
from optimizers.algorithms.dion2 import error_feedback, select_count, selection_mask, selects_rows
from optimizers.distributed import local
from optimizers.matrix_view import lr_scale, matrix_dims


def _kernel_direction(grad: torch.Tensor, state: State, group: Group) -> torch.Tensor:
    """Selects kernel rows of each trailing [kh, kw] matrix (the unflattened view), then hands the
    masked momentum to the flattened orthogonalization."""
    stored = state["momentum"]
    m = local(stored)
    m.add_(local(grad))
    mask = selection_mask(m, stored, {**group, "flatten": False}, rows_only=False)
    u = torch.where(mask, m, torch.zeros((), dtype=m.dtype, device=m.device))
    error_feedback(m, mask, group["ef_decay"])
    return u


def _ef_unselected_direction(grad: torch.Tensor, state: State, group: Group) -> torch.Tensor:
    """Error feedback on the complement of the selection."""
    stored = state["momentum"]
    m = local(stored)
    m.add_(local(grad))
    mask = selection_mask(m, stored, group, rows_only=False)
    u = torch.where(mask, m, torch.zeros((), dtype=m.dtype, device=m.device))
    error_feedback(m, ~mask, group["ef_decay"])
    return u


def _submatrix_lr_scale(shape: tuple[int, ...], group: Group) -> float:
    """adjust_lr on the selected submatrix's fans: k of the selected side instead of its full size."""
    m, n = matrix_dims(shape, group["flatten"])
    if selects_rows(shape, group["flatten"], False):
        return lr_scale((select_count(m, group["fraction"]), n), False, group["adjust_lr"])
    return lr_scale((m, select_count(n, group["fraction"])), False, group["adjust_lr"])


def kernel_selection() -> Control:
    return Control("control-dion2-kernel-selection",
                   lambda a: dataclasses.replace(a, direction=_kernel_direction))


def ef_unselected() -> Control:
    return Control("control-dion2-ef-unselected",
                   lambda a: dataclasses.replace(a, direction=_ef_unselected_direction))


def submatrix_lr() -> Control:
    return Control("control-dion2-submatrix-lr",
                   lambda a: dataclasses.replace(a, lr_scale=_submatrix_lr_scale))


class LocalAsGlobal(Control):
    """Runs the local selection scope whatever scope the case names."""

    def options(self, case: Case) -> dict[str, Any]:
        return {**super().options(case), "selection_scope": "local"}


def local_as_global() -> Control:
    return LocalAsGlobal("control-dion2-local-as-global", lambda a: a)


__all__ = ["kernel_selection", "ef_unselected", "submatrix_lr", "local_as_global"]
