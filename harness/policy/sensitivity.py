"""How much an orthogonalizer amplifies rounding, read off the spectrum of the matrix it is given.

The tolerance of a reference check is derived from this (harness/policy/tolerance.py): the matrix that
gets orthogonalized is the momentum / Nesterov direction U (Dion2: the selected submatrix of its
momentum), not the gradient, so its singular values are computed here from the FP64 state the
oracle keeps (the algorithm's `directions`, harness/algorithms.py).

Amplification A of one matrix: the first-order normwise relative error of orth(U) per unit
roundoff u, i.e. ||orth(U + dU) - orth(U)||_F / ||orth(U)||_F ~ A u.

  polynomial  X0 = U / d has singular values x_i; step k maps y -> p_k(y) = a y + b y^3 + c y^5.
              Rounding in step k is about u (|a| t + |b| t^3 + |c| t^5) (t = the largest singular
              value entering step k; large terms that cancel near y = 1 make this large), and it is
              carried to the end by the slopes |p_j'(y)| of the later steps; a perturbation u t of
              the input is carried by all of them. Per singular value:
                e_i = x_max prod_j |p_j'| + sum_k r_k prod_{j>k} |p_j'|,   A = ||e|| / ||f(x)||.
  svd         U V^T over the kept singular values s > cutoff: its derivative has terms 1/s_i and
              2/(s_i + s_j), so A = s_max / s_min(kept). A singular value within a factor RANK_GAP
              of the cut-off makes the rank decision itself depend on rounding: that is reported.

Neither form uses the gradient's condition number: a rank-deficient gradient can give a
full-rank, ill-conditioned direction (momentum sums gradients of different steps) and vice versa.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from cases import Case
from harness.algorithms import algorithm
from oracles import Conventions, Orthogonalizer, matrix_view, singular_values
from oracles.coefficients import Coefficients
from oracles.spectral import GRAM_MIN_SIDE

RANK_GAP = 4.0
"""A singular value in (cutoff / RANK_GAP, cutoff * RANK_GAP) makes the SVD's rank decision ambiguous:
two correct implementations (or the target and LAPACK) may keep it on one side and drop it on the other,
which changes orth(U) by O(1). Rounding moves a singular value by a few u s_max, far inside this gap."""


@dataclass(frozen=True)
class Sensitivity:
    """Of one orthogonalized direction (all matrices of a parameter's view).

    amplification: A above (>= 0); condition: worst s_max / s_min over its matrices (inf if rank-
    deficient); ambiguous_rank: a note when the SVD cut-off sits among its singular values, else "";
    shape: (rows, columns) of the matrices orthogonalized (Dion2: of its selected submatrices).
    """

    amplification: float
    condition: float
    ambiguous_rank: str = ""
    shape: tuple[int, int] = (0, 0)


def _steps_forward(schedule: Sequence[Coefficients], x: np.ndarray) -> list[np.ndarray]:
    """[x, p_1(x), p_2(p_1(x)), ...]: the singular values entering each step, and the result."""
    ys = [x]
    for a, b, c in schedule:
        y = ys[-1]
        y2 = y * y
        ys.append(y * (a + y2 * (b + c * y2)))
    return ys


def _row_max(y: np.ndarray) -> np.ndarray:
    return np.max(np.abs(y), axis=-1, keepdims=True, initial=0.0)


def polynomial_errors(schedule: Sequence[Coefficients], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(e_i per unit roundoff, f(x_i)) for normalised singular values `x` [..., k] (one matrix per row;
    see the module docstring)."""
    x = np.asarray(x, dtype=np.float64)
    ys = _steps_forward(schedule, x)
    tail = np.ones_like(x)
    err = np.zeros_like(x)
    for k in reversed(range(len(schedule))):
        a, b, c = schedule[k]
        y = ys[k]
        t = _row_max(y)
        err += (abs(a) * t + abs(b) * t**3 + abs(c) * t**5) * tail
        tail = tail * np.abs(a + 3.0 * b * y * y + 5.0 * c * y**4)
    err += _row_max(x) * tail
    return err, ys[-1]


def _squares(spec: Orthogonalizer, s: np.ndarray, shape: tuple[int, int]) -> tuple[float, float, str]:
    """(squared error norm, squared result norm, rank note) of matrices with singular values s [B, k]
    (descending per row; zero matrices contribute nothing)."""
    s = s[s[:, 0] > 0.0] if s.shape[-1] else s[:0]
    if not s.size:
        return 0.0, 0.0, ""
    top = s[:, :1]
    if spec.kind == "svd":
        cutoff = spec.rcond_factor * max(shape) * top
        kept = s > cutoff
        rank = kept.sum(axis=1)
        smallest = np.where(kept, s, np.inf).min(axis=1)
        near = s[(s > cutoff / RANK_GAP) & (s < cutoff * RANK_GAP)]
        rel = near / np.broadcast_to(top, s.shape)[(s > cutoff / RANK_GAP) & (s < cutoff * RANK_GAP)]
        note = (f"singular value {rel[0]:.3g} s_max within x{RANK_GAP:g} of the SVD rank cut-off "
                f"{spec.rcond_factor * max(shape):.3g} s_max" if near.size else "")
        return float(np.sum(rank * (top[:, 0] / smallest) ** 2)), float(rank.sum()), note
    frob = top * np.sqrt(np.sum((s / top) ** 2, axis=1, keepdims=True))
    x = s / np.vectorize(spec.normaliser.denominator)(frob)
    err, f = polynomial_errors(spec.schedule, x)
    return float(np.sum(err**2)), float(np.sum(f**2)), ""


def _singular_values(stack: np.ndarray) -> np.ndarray:
    """Singular values [B, k] of a stack [B, m, n]: one batched LAPACK call for small matrices; for large
    ones (short side >= oracles.spectral.GRAM_MIN_SIDE, the gpu tier's) the oracle's memoised decomposition
    of each, which the reference step then reuses (the same matrices: the directions it orthogonalizes)."""
    if min(stack.shape[-2:]) < GRAM_MIN_SIDE:
        return np.linalg.svd(stack, compute_uv=False)
    return np.stack([singular_values(m) for m in stack]) if len(stack) else np.zeros((0, min(stack.shape[-2:])))


def of_direction(u: np.ndarray, spec: Orthogonalizer, flatten: bool) -> Sensitivity:
    """Sensitivity of orth(u) for one parameter-shaped direction `u` (already in the compute format)."""
    return of_matrices(matrix_view(np.asarray(u, np.float64), flatten), spec)


def of_matrices(mats: np.ndarray | Sequence[np.ndarray], spec: Orthogonalizer) -> Sensitivity:
    """Sensitivity of orth applied to each matrix of the stack `mats` [B, m, n] (compute format), or
    of several stacks whose matrix shapes differ (the uneven TP shards of one direction: their
    squares add up; `shape` is the largest stack's)."""
    stacks = [np.asarray(mats, np.float64)] if isinstance(mats, np.ndarray) else \
        [np.asarray(m, np.float64) for m in mats if np.size(m)]
    if not stacks:  # nothing orthogonalized (an elementwise algorithm): no amplification
        return Sensitivity(0.0, 1.0)
    err_sq = ref_sq = 0.0
    notes, condition = [], 1.0
    for stack in stacks:
        s = _singular_values(stack)
        e, r, note = _squares(spec, s, stack.shape[-2:])
        err_sq, ref_sq, notes = err_sq + e, ref_sq + r, notes + ([note] if note else [])
        live = s[s[:, 0] > 0.0] if s.shape[-1] else s[:0]
        if live.size:
            with np.errstate(divide="ignore"):
                condition = max(condition, float(np.max(live[:, 0] / live[:, -1])))
    amplification = math.sqrt(err_sq / ref_sq) if ref_sq > 0.0 else 0.0
    largest = max(stacks, key=lambda m: m.shape[-2] * m.shape[-1])
    return Sensitivity(amplification, condition, notes[0] if notes else "", (largest.shape[-2], largest.shape[-1]))


def of_case(case: Case, conv: Conventions, grads: Sequence[Sequence[np.ndarray]]) -> list[list[Sensitivity]]:
    """out[i][k]: sensitivity at member i, step k, of what the FP64 reference orthogonalizes
    (the algorithm's directions from the gradients grads[k][i] in the declared forms, in the declared
    compute format)."""
    directions = algorithm(case).directions(case, conv)
    out = []
    for i in range(len(grads[0]) if grads else 0):
        m = directions.initial
        row = []
        for step in grads:
            m, mats = directions.step(m, np.asarray(step[i], np.float64))
            row.append(of_matrices(mats, conv.orthogonalizer))
        out.append(row)
    return out
