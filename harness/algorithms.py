"""The harness-side record of each optimizer algorithm a case can name (`Case.optimizer`):
its FP64 oracle, when that oracle's answer is well posed, which other case it must equal, and
whether its distributed step is layout invariant. The checks look algorithms up here and never
branch on a name, so adding an algorithm is one optimizer module, one oracle module and one
entry in `ALGORITHMS`.

Oracle step contract: `step(x, state, g) -> (x, state, margin)` in FP64, `margin` the selection
margin of a selecting algorithm (inf for the others; see oracles/dion2_reference.py).
Direction contract (what the tolerance policy reads the spectrum of, harness/sensitivity.py):
`step(m, g) -> (m, mats)`, mats [B, r, c] the matrices the oracle's step orthogonalizes, in the
declared compute format: Muon's and NorMuon's momentum/Nesterov direction, Dion2's selected
submatrices (not the whole momentum: a few selected slices can be far worse conditioned).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from cases import Case, matrix_shape
from cases.layouts import piece_sizes, shard_dim
from oracles import (Conventions, Dion2Hyper, MuonHyper, NorDion2Hyper, NorMuonHyper, initial_row_variance,
                     initial_variance, reference_dion2_step, reference_muon_step, reference_nordion2_step,
                     reference_normuon_step)
from oracles.dion2_reference import selected_direction, selects_rows
from oracles.muon_reference import matrix_view, momentum_and_direction
from oracles.rounding import machine_epsilon, round_to
from oracles.tensor_parallel import piece_bounds, reference_tp_muon_step

Step = Callable[[np.ndarray, Any, np.ndarray], tuple[np.ndarray, Any, float]]


@dataclass(frozen=True)
class Oracle:
    initial: Any
    step: Step


@dataclass(frozen=True)
class Directions:
    initial: Any
    step: Callable[[Any, np.ndarray], tuple[Any, np.ndarray]]


@dataclass(frozen=True)
class Algorithm:
    """name: `Case.optimizer`; oracle(case, conv): the FP64 reference of one member;
    ill_posed(case, margin): why a reference comparison with that selection margin is ill-posed;
    equivalent(case): a case of another algorithm whose steps this case's must equal (or None);
    layout_invariant(case): whether a distributed step must equal the single-process step;
    options(case): the algorithm's own optimizer options a case sets (beyond Muon's);
    directions(case, conv): what each FP64 oracle step orthogonalizes (the direction contract);
    includes: the algorithm whose every step this one can take (Dion2 with fraction 1 is Muon with
    momentum ef_decay), or None: its measured rounding bounds this one's from below (tolerance.py)."""

    name: str
    oracle: Callable[[Case, Conventions], Oracle]
    directions: Callable[[Case, Conventions], Directions]
    ill_posed: Callable[[Case, float], str | None] = lambda case, margin: None
    equivalent: Callable[[Case], Case | None] = lambda case: None
    layout_invariant: Callable[[Case], bool] = lambda case: True
    options: Callable[[Case], dict[str, Any]] = lambda case: {}
    includes: str | None = None


def _row_blocks(case: Case) -> list[int] | None:
    """Under Shard(0) each rank's rows: the blocks a shard-local norm restore runs over."""
    return piece_sizes(case.shape[0], case.world_size) if shard_dim(case.layout) == 0 else None


def _muon(case: Case, conv: Conventions) -> Oracle:
    """Muon's reference; under a TP layout its same-sharding one (oracles/tensor_parallel.py): the
    whole matrix for gather, each TP shard alone for per_shard, per head block with heads."""
    hyper = MuonHyper(case.lr, case.momentum, case.nesterov, case.weight_decay, case.flatten)
    tp = case.tensor_parallel

    def step(x: np.ndarray, m: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        if tp is None:
            return (*reference_muon_step(x, m, g, hyper, conv), math.inf)
        return (*reference_tp_muon_step(x, m, g, hyper, conv, tp.mode, tp.dim, tp.degree(case.world_size),
                                        tp.heads), math.inf)
    return Oracle(np.zeros(case.shape), step)


def _muon_invariant(case: Case) -> bool:
    """Layout invariant except per_shard TP, which depends on the TP degree, unless every TP shard
    holds whole heads (then it is the unsharded per-head update: per-head exactness)."""
    tp = case.tensor_parallel
    return tp is None or tp.mode == "gather" or tp.heads is not None


def _muon_options(case: Case) -> dict[str, Any]:
    """A TP case's mode and heads (optimizers/tensor_parallel.py)."""
    tp = case.tensor_parallel
    return {} if tp is None else {"tp_mode": tp.mode, "num_heads": tp.heads}


def tp_matrices(u: np.ndarray, case: Case) -> list[np.ndarray]:
    """The matrices a TP case orthogonalizes, as stacks [B, m, n] (uneven shards differ in shape): the
    whole matrix for gather, each TP shard for per_shard, each one's head blocks with heads."""
    tp = case.tensor_parallel
    blocks = [u]
    if tp.mode == "per_shard":
        cut = (lambda lo, hi: u[lo:hi]) if tp.dim == 0 else (lambda lo, hi: u[:, lo:hi])
        blocks = [cut(lo, hi) for lo, hi in piece_bounds(u.shape[tp.dim], tp.degree(case.world_size)) if hi > lo]
    if tp.heads is None:
        return [b[None] for b in blocks]
    head_dim = u.shape[0] // tp.heads
    return [b.reshape(-1, head_dim, b.shape[1]) for b in blocks]


def _momentum_directions(case: Case, conv: Conventions) -> Directions:
    """Muon's and NorMuon's: U (momentum, or its Nesterov form) in the compute format, per matrix of the view."""
    hyper = MuonHyper(case.lr, case.momentum, case.nesterov, case.weight_decay, case.flatten)

    def step(m: Any, g: np.ndarray) -> tuple[Any, np.ndarray]:
        m, u = momentum_and_direction(m, g, hyper, conv)
        if case.tensor_parallel is not None:
            return m, tp_matrices(round_to(u, conv.compute_dtype), case)
        return m, matrix_view(round_to(u, conv.compute_dtype), case.flatten)
    return Directions(np.zeros(case.shape), step)


def _normuon(case: Case, conv: Conventions) -> Oracle:
    hyper = NorMuonHyper(case.lr, case.momentum, case.nesterov, case.weight_decay, case.flatten, beta2=case.beta2)
    blocks = _row_blocks(case)  # under Shard(0) each rank restores the norm of its own rows

    def step(x: np.ndarray, state: Any, g: np.ndarray) -> tuple[np.ndarray, Any, float]:
        x, m, v = reference_normuon_step(x, *state, g, hyper, conv, blocks)
        return x, (m, v), math.inf
    return Oracle((np.zeros(case.shape), initial_variance(case.shape, case.flatten, conv.normuon_rows)), step)


def selection_blocks(case: Case) -> list[int] | None:
    """The local scope's slice groups along the selection side of the matrix view: each rank's
    slices when the layout splits that side, else None (every rank sees whole slices of one
    group, or pieces of every slice, and the local scope is the global one)."""
    dim = shard_dim(case.layout)
    if case.scope != "local" or dim is None:
        return None
    _, m, n = matrix_shape(case.shape, case.flatten)
    rows = selects_rows((m, n), case.optimizer == "nordion2")
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


def _dion2(case: Case, conv: Conventions) -> Oracle:
    hyper = Dion2Hyper(case.lr, case.fraction, case.ef_decay, case.weight_decay, case.flatten)
    blocks = selection_blocks(case)

    def step(x: np.ndarray, m: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        return reference_dion2_step(x, m, g, hyper, conv, blocks)
    return Oracle(np.zeros(case.shape), step)


def _selected_directions(case: Case, conv: Conventions) -> Directions:
    """Dion2's and NorDion2's: the selected submatrices of the error-feedback momentum."""
    hyper = Dion2Hyper(case.lr, case.fraction, case.ef_decay, case.weight_decay, case.flatten,
                       rows_only=case.optimizer == "nordion2")
    blocks = selection_blocks(case)

    def step(m: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        sel = selected_direction(m, g, hyper, conv, blocks)
        return sel.momentum, sel.inputs
    return Directions(np.zeros(case.shape), step)


def _nordion2(case: Case, conv: Conventions) -> Oracle:
    hyper = NorDion2Hyper(case.lr, case.fraction, case.ef_decay, case.weight_decay, case.flatten,
                          beta2=case.beta2)
    blocks, restore = selection_blocks(case), _row_blocks(case)

    def step(x: np.ndarray, state: Any, g: np.ndarray) -> tuple[np.ndarray, Any, float]:
        x, m, v, margin = reference_nordion2_step(x, *state, g, hyper, conv, blocks, restore)
        return x, (m, v), margin
    return Oracle((np.zeros(case.shape), initial_row_variance(case.shape, case.flatten)), step)


SELECTION_TIE_FACTOR = 4.0
"""A selection is ill-posed when the k-th and (k+1)-th slice L1 norms are closer (relatively)
than SELECTION_TIE_FACTOR x steps x u(parameter dtype). The target selects from its momentum
buffer, kept in the parameter's dtype: every step rounds it twice (M + G, then ef_decay M), each
by up to u relative, so after s steps its norms can sit 2 s u from the FP64 ones; the factor 2
above that covers the norm's own summation. Measured (optimizers.Dion2, 12x20, 8x36 and 24x6,
5 seeds, 3 steps): the worst relative norm error was 2.4e-3 in bf16 (bound 4.7e-2) and 4.0e-8
in fp32 (bound 7.2e-7)."""


def _selection_ill_posed(case: Case, margin: float) -> str | None:
    bound = SELECTION_TIE_FACTOR * case.steps * machine_epsilon(case.param_dtype) / 2.0
    if margin < bound:
        return (f"ill-posed selection: the k-th and (k+1)-th slice L1 norms differ by {margin:.3g} relative, "
                f"within the {case.param_dtype} momentum's rounding over {case.steps} steps ({bound:.3g}), so "
                f"either slice may be selected")
    return None


def _fraction_one(optimizer: str) -> Callable[[Case], Case | None]:
    """fraction 1 selects every slice: the step is `optimizer`'s (Muon or NorMuon) with momentum
    ef_decay, no Nesterov, the same orthogonalizer, options and data."""
    def equivalent(case: Case) -> Case | None:
        if case.fraction != 1.0:
            return None
        return dataclasses.replace(case, optimizer=optimizer, fraction=None, scope=None)
    return equivalent


def _dion2_invariant(case: Case) -> bool:
    """Global scope, or a layout whose ranks all see the same slices' groups, is layout invariant."""
    return selection_blocks(case) is None


def _nordion2_invariant(case: Case) -> bool:
    """NorDion2 also restores the norm of each rank's rows under Shard(0), like NorMuon."""
    return _dion2_invariant(case) and shard_dim(case.layout) != 0


def _dion2_options(case: Case) -> dict[str, Any]:
    """Single-process cases have no scope (the scopes coincide there): the optimizer's default."""
    options = dict(fraction=case.fraction, ef_decay=case.ef_decay)
    return {**options, "selection_scope": case.scope} if case.scope else options


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("muon", _muon, _momentum_directions, layout_invariant=_muon_invariant, options=_muon_options),
    Algorithm("normuon", _normuon, _momentum_directions, layout_invariant=lambda case: shard_dim(case.layout) is None),
    Algorithm("dion2", _dion2, _selected_directions, _selection_ill_posed, _fraction_one("muon"), _dion2_invariant,
              _dion2_options, includes="muon"),
    Algorithm("nordion2", _nordion2, _selected_directions, _selection_ill_posed, _fraction_one("normuon"),
              _nordion2_invariant, _dion2_options, includes="normuon"),
)}


def algorithm(case: Case) -> Algorithm:
    """The record of `case.optimizer` (KeyError names an algorithm the harness has no oracle for)."""
    try:
        return ALGORITHMS[case.optimizer]
    except KeyError:
        raise KeyError(f"the harness has no oracle for optimizer {case.optimizer!r}; "
                       f"known: {tuple(ALGORITHMS)}") from None
