"""Deterministic FP64 inputs of a case: initial parameters and gradients (NumPy).

Each array comes from its own generator seeded by (case seed, member, step), so a
megabatch member gets the same data whatever the megabatch size, and a case
reproduces bit for bit on any machine.

Gradient kinds, built on the case's matrix view (flattened or trailing matrices):
  gaussian  i.i.d. N(0, 1)
  lowrank   effective low rank: max(1, min(m, n) // 8) singular values 1, the rest 1e-2
            (condition number 100: resolvable in bf16, far above every SVD rank cut-off)
  rankdef   exact rank max(1, min(m, n) // 2)
  zero      all zeros
  tiny      gaussian * 1e-10 (the normaliser's eps dominates)
  huge      gaussian * 1e10
  extreme   gaussian * 2^(emax - axes.EXTREME_HEADROOM), emax the largest binade of the parameter's dtype
            (2^107, about 1.6e32, for fp32 and bf16; 2^1003, about 8.6e301, for fp64)
  nonfinite gaussian, with element 0 of member 0's last gradient NaN
"""

from __future__ import annotations

import math

import numpy as np

from cases.axes import EXTREME_GRADIENT, EXTREME_HEADROOM, NONFINITE_GRADIENT, PARAM_SCALE
from cases.case import Case

_SCALES = {"tiny": 1e-10, "huge": 1e10}
_EMAX = {"fp64": 1023, "fp32": 127, "bf16": 127, "fp16": 15}
"""The largest binade of each parameter dtype (its largest finite value is below 2^(emax + 1))."""


def extreme_scale(param_dtype: str) -> float:
    """The factor of an extreme gradient of a `param_dtype` parameter: an exact power of two."""
    return 2.0 ** (_EMAX[param_dtype] - EXTREME_HEADROOM)
_INIT_STREAM = 10_000


def _rng(case: Case, member: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([case.seed, member, stream])


def matrix_shape(shape: tuple[int, ...], flatten: bool) -> tuple[int, int, int]:
    """(batch, m, n) of the matrix view of one parameter."""
    if flatten or len(shape) == 2:
        return 1, shape[0], math.prod(shape[1:])
    return math.prod(shape[:-2]), shape[-2], shape[-1]


def _spectrum(rng: np.random.Generator, b: int, m: int, n: int, lowrank: bool) -> np.ndarray:
    k = min(m, n)
    u = np.linalg.qr(rng.standard_normal((b, m, k)))[0]
    v = np.linalg.qr(rng.standard_normal((b, n, k)))[0]
    if lowrank:
        s = np.where(np.arange(k) < max(1, k // 8), 1.0, 1e-2)
    else:
        s = np.where(np.arange(k) < max(1, k // 2), rng.uniform(0.5, 2.0, k), 0.0)
    return (u * s) @ np.swapaxes(v, -1, -2)


def gradient(case: Case, member: int, step: int) -> np.ndarray:
    """Gradient of megabatch member `member` at step `step` (0-based), FP64."""
    rng = _rng(case, member, step)
    if case.grad == "zero":
        return np.zeros(case.shape)
    if case.grad in ("lowrank", "rankdef"):
        b, m, n = matrix_shape(case.shape, case.flatten)
        return _spectrum(rng, b, m, n, lowrank=case.grad == "lowrank").reshape(case.shape) * math.sqrt(m * n)
    if case.grad == EXTREME_GRADIENT:
        return rng.standard_normal(case.shape) * extreme_scale(case.param_dtype)
    if case.grad == NONFINITE_GRADIENT:
        g = rng.standard_normal(case.shape)
        if member == 0 and step == case.steps - 1:
            g.flat[0] = np.nan
        return g
    return rng.standard_normal(case.shape) * _SCALES.get(case.grad, 1.0)


def initial_parameter(case: Case, member: int) -> np.ndarray:
    """Initial value of megabatch member `member`, FP64, N(0, PARAM_SCALE^2)."""
    return _rng(case, member, _INIT_STREAM).standard_normal(case.shape) * PARAM_SCALE
