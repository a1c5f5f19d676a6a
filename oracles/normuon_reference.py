"""FP64 reference NorMuon on the equivalent 2-D matrix: one parameter, unbatched, NumPy only.

After Muon's orthogonalization O of each matrix [m, n] of the parameter's matrix view
(flatten: the one matrix [out, prod(rest)]; otherwise the trailing matrices):

  v <- beta2 v + (1 - beta2) mean_row(O^2)      one value per row (output channel)
  N = O / (sqrt(v) + eps)                         rows normalised
  N <- N * ||O||_F / ||N||_F                      Frobenius norm of the whole parameter restored
                                                  (of each rank's rows, under a Shard(0) layout)
  X <- X (1 - lr_wd wd);  X <- X - lr scale N     Muon's lr scale and decoupled decay (declared order)

`v` is kept as [B, m]: B matrices of the view, m rows each. With the "trailing" row convention
the rows are those of every trailing 2-D slice [shape[-2], shape[-1]] (the unflattened view) and
the norm is restored per slice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oracles.conventions import Conventions
from oracles.muon_reference import MuonHyper, apply_update, matrix_view, orthogonalized_direction


@dataclass(frozen=True)
class NorMuonHyper(MuonHyper):
    """Muon's hyper-parameters plus the row second moment's decay and epsilon."""

    beta2: float = 0.95
    variance_eps: float = 1e-8


def initial_variance(shape: tuple[int, ...], flatten: bool, rows: str = "matrix") -> np.ndarray:
    """Zero second moment [B, m] for a parameter of `shape` (`rows`: Conventions.normuon_rows)."""
    b, m, _ = matrix_view(np.zeros(shape), flatten and rows == "matrix").shape
    return np.zeros((b, m))


def normalise_rows(o: np.ndarray, v: np.ndarray, hyper: NorMuonHyper,
                   row_blocks: list[int] | None = None, rows: str = "matrix") -> tuple[np.ndarray, np.ndarray]:
    """(row-normalised, norm-restored update in o's shape, new v [B, m]) for orthogonalized `o`.

    row_blocks: sizes of consecutive blocks along the parameter's dim 0 (a Shard(0) layout); the
    norm is then restored block by block, as each rank does with its own rows. None: one block.
    rows "trailing": rows of the trailing 2-D slices, norm restored per slice; a 3-D+ parameter's
    Shard(0) blocks are unions of whole slices, so row_blocks change nothing there, and a 2-D
    parameter is its own one slice (the "matrix" rows, with row_blocks)."""
    mats = matrix_view(o, hyper.flatten and rows == "matrix")
    v = hyper.beta2 * v + (1.0 - hyper.beta2) * np.mean(mats * mats, axis=-1)
    normed = (mats / (np.sqrt(v)[..., None] + hyper.variance_eps))
    if rows == "trailing" and o.ndim > 2:
        norm_o = np.linalg.norm(mats, axis=(-2, -1), keepdims=True)
        norm_n = np.linalg.norm(normed, axis=(-2, -1), keepdims=True)
        safe = np.where(norm_n > 0.0, norm_n, 1.0)
        return (normed * np.where(norm_n > 0.0, norm_o / safe, 1.0)).reshape(o.shape), v
    return restore_block_norms(o, normed.reshape(o.shape), row_blocks), v


def restore_block_norms(update: np.ndarray, normed: np.ndarray, row_blocks: list[int] | None) -> np.ndarray:
    """`normed` scaled, block by block of `row_blocks` (sizes along dim 0; one block when None), to the
    Frobenius norm of the same block of `update`; a block normalised to zero stays zero. In place."""
    bounds = np.cumsum([0, *(row_blocks or [update.shape[0]])])
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        norm_o, norm_n = np.linalg.norm(update[lo:hi]), np.linalg.norm(normed[lo:hi])
        if norm_n > 0.0:
            normed[lo:hi] *= norm_o / norm_n
    return normed


def reference_normuon_step(x: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray, hyper: NorMuonHyper,
                           conv: Conventions, row_blocks: list[int] | None = None
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One FP64 NorMuon step of one parameter: returns (new parameter, new momentum, new v [B, m]).
    With `row_blocks`, the same-sharding reference of a Shard(0) layout (see normalise_rows)."""
    m, o = orthogonalized_direction(m, g, hyper, conv)
    update, v = normalise_rows(o, np.asarray(v, np.float64), hyper, row_blocks, conv.normuon_rows)
    return apply_update(np.asarray(x, dtype=np.float64), update, hyper, conv), m, v
