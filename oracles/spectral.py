"""FP64 spectral oracles: the exact action of an odd matrix polynomial iteration,
and the polar factor, through one LAPACK SVD per matrix.

If G = U S V^T, one step X <- aX + b(XX^T)X + c(XX^T)^2 X maps singular values
through p(s) = a s + b s^3 + c s^5 and keeps U, V. So k steps after normalising
X0 = G / (scale*||G||_F + eps) equal U f(S / (scale*||G||_F + eps)) V^T with f the
composition of the step polynomials.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import scipy.linalg

from oracles.coefficients import Coefficients


@dataclass(frozen=True)
class Normaliser:
    """How the iteration's start X0 = G / d is formed.

    form "plus":  d = scale * ||G||_F + eps      (Keller Jordan, Polar Express)
    form "clamp": d = max(scale * ||G||_F, eps)  (torch.optim.Muon)
    """

    eps: float = 1e-7
    scale: float = 1.0
    form: str = "plus"

    def __post_init__(self) -> None:
        if self.form not in ("plus", "clamp"):
            raise ValueError(f"unknown normaliser form {self.form!r}")

    def denominator(self, frobenius: float) -> float:
        if self.form == "plus":
            return self.scale * frobenius + self.eps
        return max(self.scale * frobenius, self.eps)


def _svd(g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if g.ndim != 2:
        raise ValueError(f"expected a matrix, got shape {g.shape}")
    return scipy.linalg.svd(np.asarray(g, dtype=np.float64), full_matrices=False,
                            lapack_driver="gesvd")


def frobenius(s: np.ndarray) -> float:
    """||G||_F from G's singular values, scaled so that neither tiny nor huge values under/overflow."""
    top = float(np.max(s, initial=0.0))
    return top * float(np.sqrt(np.sum((s / top) ** 2))) if top > 0.0 else 0.0


def compose(schedule: Sequence[Coefficients], s: np.ndarray) -> np.ndarray:
    """The scalar map f = p_k o ... o p_1 applied elementwise to `s`."""
    x = np.asarray(s, dtype=np.float64)
    for a, b, c in schedule:
        x2 = x * x
        x = x * (a + x2 * (b + c * x2))
    return x


def spectral_map(g: np.ndarray, schedule: Sequence[Coefficients], normaliser: Normaliser) -> np.ndarray:
    """Exact result of the polynomial iteration `schedule` started from normalised `g`."""
    u, s, vt = _svd(g)
    d = normaliser.denominator(frobenius(s))
    if d == 0.0:
        return np.zeros_like(g, dtype=np.float64)
    return (u * compose(schedule, s / d)) @ vt


def polar_factor(g: np.ndarray, rcond: float) -> np.ndarray:
    """U V^T over the singular values above rcond * s_max (zero matrix -> zero)."""
    u, s, vt = _svd(g)
    if s.size == 0 or s[0] == 0.0:
        return np.zeros_like(g, dtype=np.float64)
    keep = s > rcond * s[0]
    return (u[:, keep]) @ vt[keep, :]


def singular_values(g: np.ndarray) -> np.ndarray:
    """Singular values of a matrix, descending, in FP64."""
    return scipy.linalg.svd(np.asarray(g, dtype=np.float64), compute_uv=False, lapack_driver="gesvd")


def condition_number(g: np.ndarray) -> float:
    """s_max / s_min over min(m, n) singular values: inf if rank-deficient, 1 for a zero matrix."""
    s = singular_values(g)
    if s.size == 0 or s[0] == 0.0:
        return 1.0
    return float(s[0] / s[-1]) if s[-1] > 0.0 else float("inf")
