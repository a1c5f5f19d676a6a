"""FP64 reference Dion2 and NorDion2 on the equivalent 2-D matrix: one parameter, NumPy only.

Dion2 (Microsoft's `dion` package, `dion/dion2.py`), per matrix [m, n] of the parameter's
matrix view (flatten: the one matrix [out, prod(rest)]; otherwise the trailing matrices):

  M <- M + G                                         stored in the declared state format
  slices: the rows if m <= n, else the columns (NorDion2: always the rows)
  S = the k = max(1, ceil(fraction * #slices)) slices of largest L1 norm in M
  U = M[S];  M[S] <- ef_decay * M[S]                 error feedback on the selected slices only,
                                                     stored in the state format (ef_decay held in its
                                                     opmath format, as Muon's mu is)
  O = orth(round_compute(U))                         the submatrix, orthogonalized alone
  X <- X (1 - lr wd);  X[S] <- X[S] - lr scale O      scale from the FULL matrix view (as Muon's)

Ties: slices sorted by L1 norm, descending, equal norms in ascending index order (a stable
sort); the first k are taken. The selection `margin` reports how well posed that is:
min over matrices of (|k-th| - |(k+1)-th|) / |k-th| (inf when every slice is taken, 0 when
the k-th and (k+1)-th norms are equal, including all-zero slices).

Local selection scope: `blocks` splits the slices into consecutive groups (the pieces the
ranks of a sharded layout hold); each group selects its own max(1, ceil(fraction * size))
slices (none from an empty group), so the selected set depends on the layout.

NorDion2 (`dion/nordion2.py`): the selected rows of O are normalised as NorMuon does:
  v[S] <- beta2 v[S] + (1 - beta2) mean_row(O^2)       v kept for every row, updated where selected
  N = O / (sqrt(v[S]) + eps);  N <- N ||O||_F / ||N||_F   the norm of the parameter's selected update
                                                          (of each rank's rows, under a Shard(0) layout)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from oracles.conventions import Conventions
from oracles.muon_reference import apply_update, axpby, held_coefficient, matrix_view, orthogonalize
from oracles.normuon_reference import restore_block_norms
from oracles.rounding import round_direction, round_to, stored


@dataclass(frozen=True)
class Dion2Hyper:
    """The hyper-parameters of one Dion2 step (`rows_only`: NorDion2's row selection)."""

    lr: float
    fraction: float
    ef_decay: float
    weight_decay: float
    flatten: bool
    rows_only: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"Dion2Hyper.fraction={self.fraction!r} must be in (0, 1]")


@dataclass(frozen=True)
class NorDion2Hyper(Dion2Hyper):
    """Dion2's hyper-parameters plus NorMuon's row second-moment decay and epsilon; rows only."""

    rows_only: bool = True
    beta2: float = 0.95
    variance_eps: float = 1e-8


def select_count(n: int, fraction: float) -> int:
    """How many of `n` slices are selected: max(1, ceil(fraction n)), none of none."""
    return max(1, math.ceil(fraction * n)) if n else 0


def select(norms: np.ndarray, fraction: float, blocks: list[int] | None = None) -> tuple[np.ndarray, float]:
    """(selected slice indices ascending, margin) for slice L1 norms `norms` [n]: per block
    (None: one block) the select_count largest, equal norms in ascending index order."""
    chosen, margin = [], math.inf
    bounds = np.cumsum([0, *(blocks if blocks is not None else [norms.size])])
    if bounds[-1] != norms.size:
        raise ValueError(f"blocks {blocks} do not cover the {norms.size} slices")
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        part = norms[lo:hi]
        k = select_count(part.size, fraction)
        order = np.argsort(-part, kind="stable")
        chosen.append(lo + order[:k])
        if k < part.size:
            kth, next_ = part[order[k - 1]], part[order[k]]
            margin = min(margin, (kth - next_) / kth if kth > 0.0 else 0.0)
    return np.sort(np.concatenate(chosen)).astype(np.int64), margin


def selects_rows(shape: tuple[int, int], rows_only: bool) -> bool:
    """True if the slices of a matrix of `shape` [m, n] are its rows (the shorter side, or NorDion2)."""
    return rows_only or shape[0] <= shape[1]


@dataclass(frozen=True)
class Selected:
    """One step's selection and orthogonalized submatrices, per matrix of the view."""

    momentum: np.ndarray      # the new momentum, error feedback applied, parameter shape
    update: np.ndarray        # orth of each selected submatrix, zero elsewhere, parameter shape
    rows: list[np.ndarray]    # per matrix: the selected slice indices
    margin: float             # min selection margin over the matrices
    inputs: np.ndarray        # [B, k, n]: the selected submatrices as orthogonalized (compute format,
                              # slices as rows)


def selected_direction(m: np.ndarray, g: np.ndarray, hyper: Dion2Hyper, conv: Conventions,
                       blocks: list[int] | None = None) -> Selected:
    """M <- M + G, top-k selection, error feedback, orth of each selected submatrix; the buffer
    stored in `conv.state_dtype` after each update (exact in fp64)."""
    held = conv.state_dtype
    m = axpby(1.0, m, 1.0, round_to(g, held), held)
    ef_decay = held_coefficient(hyper.ef_decay, held)
    mats = matrix_view(m.copy(), hyper.flatten)
    update = np.zeros_like(mats)
    rows, inputs, margin = [], [], math.inf
    for b, mat in enumerate(mats):
        on_rows = selects_rows(mat.shape, hyper.rows_only)
        view, out = (mat, update[b]) if on_rows else (mat.T, update[b].T)
        idx, mg = select(np.abs(view).sum(axis=1), hyper.fraction, blocks)
        sub = view[idx]
        inputs.append(round_direction(sub, conv.compute_dtype))
        out[idx] = orthogonalize(inputs[-1][None], conv.orthogonalizer, False)[0]
        view[idx] = stored(ef_decay * sub, held)
        rows.append(idx)
        margin = min(margin, mg)
    return Selected(mats.reshape(m.shape), update.reshape(m.shape), rows, margin, np.stack(inputs))


def reference_dion2_step(x: np.ndarray, m: np.ndarray, g: np.ndarray, hyper: Dion2Hyper, conv: Conventions,
                         blocks: list[int] | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """One FP64 Dion2 step of one parameter: (new parameter, new momentum, selection margin).
    `blocks`: the local selection scope's slice groups (see the module docstring)."""
    sel = selected_direction(m, g, hyper, conv, blocks)
    return apply_update(np.asarray(x, np.float64), sel.update, hyper, conv), sel.momentum, sel.margin


def initial_row_variance(shape: tuple[int, ...], flatten: bool) -> np.ndarray:
    """Zero NorDion2 second moment [B, m]: one value per row of each matrix of the view."""
    b, rows, _ = matrix_view(np.zeros(shape), flatten).shape
    return np.zeros((b, rows))


def normalise_selected_rows(update: np.ndarray, rows: list[np.ndarray], v: np.ndarray, hyper: NorDion2Hyper,
                            row_blocks: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(normalised update, new v [B, m]): NorMuon's row normalisation of the selected rows of
    each matrix, v updated only there, then the parameter's selected-update norm restored
    (block by block of `row_blocks`, sizes along the parameter's dim 0, when given)."""
    mats = matrix_view(update, hyper.flatten)
    v = np.array(v, np.float64)
    normed = np.zeros_like(mats)
    for b, idx in enumerate(rows):
        o = mats[b][idx]
        v[b, idx] = hyper.beta2 * v[b, idx] + (1.0 - hyper.beta2) * np.mean(o * o, axis=1)
        normed[b][idx] = o / (np.sqrt(v[b, idx])[:, None] + hyper.variance_eps)
    return restore_block_norms(update, normed.reshape(update.shape), row_blocks), v


def reference_nordion2_step(x: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray, hyper: NorDion2Hyper,
                            conv: Conventions, blocks: list[int] | None = None, row_blocks: list[int] | None = None
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """One FP64 NorDion2 step: (new parameter, new momentum, new v [B, m], selection margin).
    `row_blocks`: a Shard(0) layout's rows per rank, each restoring its own norm."""
    if not hyper.rows_only:
        raise ValueError("NorDion2 selects rows: NorDion2Hyper.rows_only must be True")
    sel = selected_direction(m, g, hyper, conv, blocks)
    update, v = normalise_selected_rows(sel.update, sel.rows, v, hyper, row_blocks)
    return apply_update(np.asarray(x, np.float64), update, hyper, conv), sel.momentum, v, sel.margin
