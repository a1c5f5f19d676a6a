"""Dion2: error-feedback momentum, of which the `fraction` of slices with the largest L1 norms is
orthogonalized (oracles/dion2_reference.py). Fraction 1 selects every slice: Muon with momentum ef_decay.
Under the local selection scope each rank selects among its own slices, so that scope's distributed step
depends on the layout."""

from __future__ import annotations

import dataclasses
import math
from types import MappingProxyType
from typing import Any, Callable

import numpy as np

from cases import Case, matrix_shape
from cases.axes import EF_DECAY
from cases.layouts import piece_sizes, shard_dim
from harness.algorithms import AlgorithmInfo, Directions, Oracle, muon
from harness.policy.ill_posed import selection_ill_posed
from oracles import Conventions, Dion2Hyper, reference_dion2_step
from oracles.dion2_reference import selected_direction, selects_rows


def selection_blocks(case: Case, rows_only: bool = False) -> list[int] | None:
    """The local scope's slice groups along the selection side of the matrix view (rows, or whichever
    side is shorter unless `rows_only`): each rank's slices when the layout splits that side, else None
    (every rank sees whole slices of one group, or pieces of every slice, and the local scope is the
    global one)."""
    dim = shard_dim(case.layout)
    if case.scope != "local" or dim is None:
        return None
    _, m, n = matrix_shape(case.shape, case.flatten)
    rows = selects_rows((m, n), rows_only)
    ndim = len(case.shape)
    if case.flatten or ndim == 2:
        if rows and dim == 0:
            return piece_sizes(case.shape[0], case.world_size)
        if not rows and dim == 1:
            inner = math.prod(case.shape[2:])
            return [s * inner for s in piece_sizes(case.shape[1], case.world_size)]
        return None
    side = ndim - 2 if rows else ndim - 1
    return piece_sizes(case.shape[side], case.world_size) if dim == side else None


def _oracle(case: Case, conv: Conventions) -> Oracle:
    hyper = Dion2Hyper(case.lr, case.fraction, case.ef_decay, case.weight_decay, case.flatten)
    blocks = selection_blocks(case)

    def step(x: np.ndarray, m: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        return reference_dion2_step(x, m, g, hyper, conv, blocks)
    return Oracle(np.zeros(case.shape), step)


def selected_directions(rows_only: bool) -> Callable[[Case, Conventions], Directions]:
    """Dion2's (and, selecting rows only, NorDion2's): the selected submatrices of the error-feedback
    momentum."""
    def directions(case: Case, conv: Conventions) -> Directions:
        hyper = Dion2Hyper(case.lr, case.fraction, case.ef_decay, case.weight_decay, case.flatten,
                           rows_only=rows_only)
        blocks = selection_blocks(case, rows_only)

        def step(m: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            sel = selected_direction(m, g, hyper, conv, blocks)
            return sel.momentum, sel.inputs
        return Directions(np.zeros(case.shape), step)
    return directions


def fraction_one(optimizer: str) -> Callable[[Case], Case | None]:
    """fraction 1 selects every slice: the step is `optimizer`'s (Muon or NorMuon) with momentum
    ef_decay, no Nesterov, the same orthogonalizer, options and data, built explicitly (`Case.construct`: its
    momentum is no default)."""
    def equivalent(case: Case) -> Case | None:
        if case.fraction != 1.0:
            return None
        return dataclasses.replace(case, optimizer=optimizer, fraction=None, scope=None, momentum=case.ef_decay,
                                   ef_decay=EF_DECAY, construct="explicit")
    return equivalent


def invariant(case: Case) -> bool:
    """Global scope, or a layout whose ranks all see the same slices' groups, is layout invariant."""
    return selection_blocks(case) is None


def options(case: Case) -> dict[str, Any]:
    """Single-process cases have no scope (the scopes coincide there): the optimizer's default."""
    chosen = dict(fraction=case.fraction, ef_decay=case.ef_decay)
    return {**chosen, "selection_scope": case.scope} if case.scope else chosen


DEFAULTS = MappingProxyType({**muon.DEFAULTS, "fraction": 0.25, "ef_decay": 0.95})
"""`optimizers.Dion2`'s documented defaults (docs/optimizers.md); single-process, so no selection scope."""

INFO = AlgorithmInfo("dion2", _oracle, selected_directions(False), selection_ill_posed, selects=True,
                     local_blocks=selection_blocks, equivalent=fraction_one("muon"), layout_invariant=invariant,
                     options=options, defaults=DEFAULTS, includes="muon")
