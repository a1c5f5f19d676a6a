"""FP64 reference Muon: one parameter, unbatched, NumPy/LAPACK only.

  M <- mu M + G  (or the declared EMA form)
  U = G + mu M with Nesterov (or the declared form), else M
  O = orth(round_compute(U)) per matrix of the parameter's matrix view
  X <- X (1 - lr_wd wd); X <- X - lr scale O   (or the declared order)

Matrix view: with flatten, [out, *rest] is the one matrix [out, prod(rest)];
without, a 2-D parameter is itself and a 3-D+ one is a batch of its trailing 2-D
matrices, each orthogonalized (and normalised) on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oracles.conventions import Conventions, Orthogonalizer, lr_scale
from oracles.rounding import round_to
from oracles.spectral import condition_number, polar_factor, spectral_map


@dataclass(frozen=True)
class MuonHyper:
    """The hyper-parameters of one Muon step."""

    lr: float
    momentum: float
    nesterov: bool
    weight_decay: float
    flatten: bool


def matrix_view(x: np.ndarray, flatten: bool) -> np.ndarray:
    """The stack of matrices [B, m, n] a parameter is orthogonalized as."""
    if x.ndim < 2:
        raise ValueError(f"Muon needs a parameter of 2 or more dims, got shape {x.shape}")
    if flatten:
        return x.reshape(1, x.shape[0], -1)
    return x.reshape(-1, x.shape[-2], x.shape[-1])


def orthogonalize(u: np.ndarray, spec: Orthogonalizer, flatten: bool) -> np.ndarray:
    """orth applied to every matrix of the view of `u`, returned in `u`'s shape."""
    mats = matrix_view(u, flatten)
    if spec.kind == "svd":
        out = [polar_factor(m, spec.rcond_factor * max(m.shape)) for m in mats]
    else:
        out = [spectral_map(m, spec.schedule, spec.normaliser) for m in mats]
    return np.stack(out).reshape(u.shape)


def max_condition(x: np.ndarray, flatten: bool) -> float:
    """The largest condition number among the matrices of the view of `x`."""
    return max(condition_number(m) for m in matrix_view(np.asarray(x, np.float64), flatten))


def momentum_and_direction(m: np.ndarray, g: np.ndarray, hyper: MuonHyper,
                           conv: Conventions) -> tuple[np.ndarray, np.ndarray]:
    """(new momentum buffer, the matrix U that gets orthogonalized)."""
    mu = hyper.momentum
    m = mu * m + (g if conv.momentum == "sum" else (1.0 - mu) * g)
    if not hyper.nesterov:
        return m, m
    u = g + mu * m if conv.nesterov == "sum" else (1.0 - mu) * g + mu * m
    return m, u


def apply_update(x: np.ndarray, update: np.ndarray, hyper: MuonHyper, conv: Conventions) -> np.ndarray:
    """X (1 - lr_wd wd) - lr scale update, in the declared order, with the declared lr scale."""
    scale = lr_scale(x.shape, conv.lr_scale, conv.lr_dims)
    lr_wd = hyper.lr if conv.weight_decay_lr == "base" else hyper.lr * scale
    decay = 1.0 - lr_wd * hyper.weight_decay
    if conv.weight_decay_order == "before":
        return x * decay - hyper.lr * scale * update
    return (x - hyper.lr * scale * update) * decay


def orthogonalized_direction(m: np.ndarray, g: np.ndarray, hyper: MuonHyper,
                             conv: Conventions) -> tuple[np.ndarray, np.ndarray]:
    """(new momentum, O = orth(round_compute(U))) of one parameter."""
    m, u = momentum_and_direction(np.asarray(m, np.float64), np.asarray(g, np.float64), hyper, conv)
    return m, orthogonalize(round_to(u, conv.compute_dtype), conv.orthogonalizer, hyper.flatten)


def reference_muon_step(x: np.ndarray, m: np.ndarray, g: np.ndarray, hyper: MuonHyper,
                        conv: Conventions) -> tuple[np.ndarray, np.ndarray]:
    """One FP64 Muon step of one parameter: returns (new parameter, new momentum)."""
    m, o = orthogonalized_direction(m, g, hyper, conv)
    return apply_update(np.asarray(x, dtype=np.float64), o, hyper, conv), m
