"""FP64 reference Muon: one parameter, unbatched, NumPy/LAPACK only.

  M <- mu M + G  (or the declared EMA form), stored in the declared state format
  U = G + mu M with Nesterov (or the declared form), else M
  O = orth(round_compute(U)) per matrix of the parameter's matrix view
      (stochastic rounding: its expectation, U itself)
  X <- X (1 - lr_wd wd); X <- X - lr scale O   (or the declared order; cautious decay masks
      the entries where X O <= 0; lr and scale held in the declared lr format; or, declared
      decay_dtype, X <- X - lr scale round(O + wd X) with the decay folded into the held update)

Matrix view: with flatten, [out, *rest] is the one matrix [out, prod(rest)];
without, a 2-D parameter is itself and a 3-D+ one is a batch of its trailing 2-D
matrices, each orthogonalized (and normalised) on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Union

import numpy as np

from oracles.conventions import Conventions, Orthogonalizer, lr_scale
from oracles.rounding import opmath, round_direction, round_to, stored
from oracles.spectral import polar_factor, spectral_map


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


class DebiasedMomentum(NamedTuple):
    """The momentum state of a bias-corrected EMA: the buffer and how many steps made it."""

    buffer: np.ndarray
    steps: int


Momentum = Union[np.ndarray, DebiasedMomentum]
"""A momentum state: the buffer, or for "ema_debiased" a DebiasedMomentum (an array before the first step)."""


def _held(value: float, fmt: str) -> float:
    return float(round_to(np.float64(value), fmt))


def held_coefficient(value: float, state_dtype: str) -> float:
    """A Python-float coefficient (mu, ef_decay) as an op on a `state_dtype` buffer holds it: in
    opmath(state_dtype), e.g. fp32 for a bf16 buffer (0.95, not bf16's 0.94921875)."""
    return _held(value, opmath(state_dtype))


def axpby(a: float, x: np.ndarray, b: float, y: np.ndarray, fmt: str) -> np.ndarray:
    """a x + b y evaluated as ops on `fmt` tensors: each product and the sum stored in `fmt`
    (oracles.rounding.stored; exact in fp64)."""
    return stored(stored(a * np.asarray(x, np.float64), fmt) + stored(b * np.asarray(y, np.float64), fmt), fmt)


def momentum_and_direction(m: Momentum, g: np.ndarray, hyper: MuonHyper,
                           conv: Conventions) -> tuple[Momentum, np.ndarray]:
    """(new momentum state, the matrix U that gets orthogonalized). The buffer is updated in
    `conv.state_dtype`, as the implementation holds it: G, the coefficients, each product and the
    sum are stored in that format, the coefficients held in its opmath format (held_coefficient);
    U is formed from the exact G and mu and the stored buffer."""
    held, mu, g = conv.state_dtype, hyper.momentum, np.asarray(g, np.float64)
    g_held, mu_held = round_to(g, held), held_coefficient(mu, held)
    if conv.momentum == "ema_debiased":
        buffer, steps = (m.buffer, m.steps) if isinstance(m, DebiasedMomentum) else (m, 0)
        beta = held_coefficient(1.0 - (1.0 - mu_held) / (1.0 - mu_held ** (steps + 1)), held)
        buf = axpby(beta, buffer, 1.0 - beta, g_held, held)
        state: Momentum = DebiasedMomentum(buf, steps + 1)
    else:
        state = buf = axpby(mu_held, m, 1.0 if conv.momentum == "sum" else 1.0 - mu_held, g_held, held)
    if not hyper.nesterov:
        return state, buf
    if conv.nesterov == "sum":
        return state, g + mu * buf
    if conv.nesterov == "ema":
        return state, (1.0 - mu) * g + mu * buf
    return state, g + buf


def step_sizes(shape: tuple[int, ...], hyper: MuonHyper, conv: Conventions) -> tuple[float, float]:
    """(lr * scale, lr_wd) as the implementation holds them: each factor and the product
    rounded to `conv.lr_dtype`."""
    lr = _held(hyper.lr, conv.lr_dtype)
    step = _held(lr * _held(lr_scale(shape, conv.lr_scale, conv.lr_dims), conv.lr_dtype), conv.lr_dtype)
    return step, (lr if conv.weight_decay_lr == "base" else step)


def apply_update(x: np.ndarray, update: np.ndarray, hyper: MuonHyper, conv: Conventions,
                 scale_shape: tuple[int, ...] | None = None) -> np.ndarray:
    """X (1 - lr_wd wd) - lr scale update, in the declared order, with the declared lr scale (of
    `scale_shape`, default X's shape: e.g. one head block); cautious decay leaves the entries where
    X * update <= 0 undecayed."""
    step, lr_wd = step_sizes(x.shape if scale_shape is None else scale_shape, hyper, conv)
    mask = np.where(x * update > 0.0, 1.0, 0.0) if conv.weight_decay_mask == "cautious" else 1.0
    if conv.decay_dtype != "fp64":
        # decay folded into the update, held in decay_dtype: X - step round(O + (lr_wd / step) wd X mask)
        return x - step * stored(update + (lr_wd / step) * hyper.weight_decay * x * mask, conv.decay_dtype)
    decay = 1.0 - lr_wd * hyper.weight_decay
    if conv.weight_decay_mask == "cautious":
        decay = np.where(x * update > 0.0, decay, 1.0)
    if conv.weight_decay_order == "before":
        return x * decay - step * update
    return (x - step * update) * decay


def orthogonalized_direction(m: Momentum, g: np.ndarray, hyper: MuonHyper,
                             conv: Conventions) -> tuple[Momentum, np.ndarray]:
    """(new momentum, O = orth(round_compute(U))) of one parameter; with stochastic rounding
    the reference is its expectation, orth(U)."""
    m, u = momentum_and_direction(m, g, hyper, conv)
    rounded = round_direction(u, conv.compute_dtype) if conv.rounding == "nearest" else u
    return m, orthogonalize(rounded, conv.orthogonalizer, hyper.flatten)


def reference_muon_step(x: np.ndarray, m: Momentum, g: np.ndarray, hyper: MuonHyper,
                        conv: Conventions) -> tuple[np.ndarray, Momentum]:
    """One FP64 Muon step of one parameter: returns (new parameter, new momentum state).
    `m` is the state the previous step returned (any array before the first step)."""
    m, o = orthogonalized_direction(m, g, hyper, conv)
    return apply_update(np.asarray(x, dtype=np.float64), o, hyper, conv), m
