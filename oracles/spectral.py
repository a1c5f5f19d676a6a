"""FP64 spectral oracles: the exact action of an odd matrix polynomial iteration,
and the polar factor, through one LAPACK decomposition per matrix.

If G = U S V^T, one step X <- aX + b(XX^T)X + c(XX^T)^2 X maps singular values
through p(s) = a s + b s^3 + c s^5 and keeps U, V. So k steps after normalising
X0 = G / (scale*||G||_F + eps) equal U f(S / (scale*||G||_F + eps)) V^T with f the
composition of the step polynomials.

Large matrices (short side >= GRAM_MIN_SIDE: the gpu tier's 2048 x 4096, never a CI or nightly
layer, which keep the SVD arithmetic exactly) go through the eigendecomposition of the Gram matrix of
their short side where that is accurate: for a wide A (m <= n), A A^T = Q L Q^T (L = S^2), and every
map here is f(A) = Q h(L) Q^T A with h(l) = f(sqrt l) / sqrt l (for an odd polynomial f, h is a
polynomial in l: no square root, no division). One m x m symmetric eigendecomposition and two
products cost a fraction of the m x n SVD (~30x faster on the gpu tier: docs/gpu-speed.md). Squaring the matrix
squares its condition number, so the Gram path is taken only where a first-order bound of its own
error is below GRAM_RTOL (`_gram_error`); elsewhere (rank-deficient, ill-conditioned) the SVD.
Decompositions of large matrices are memoised by content (`_decompose`), so the checks that rebuild
the same reference (reference, scale, the tolerance's sensitivity, the report's spectra) share one.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence, Union

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

    def scaled_denominator(self, frobenius: float, factor: float) -> float:
        """d / factor for the matrix G = factor * G', from ||G'||_F = `frobenius` (factor a power of two):
        denominator(factor * frobenius) / factor to the bit where that is a float, and also where G's
        norm is not (beyond fp64's range)."""
        if self.form == "plus":
            return self.scale * frobenius + self.eps / factor
        return max(self.scale * frobenius, self.eps / factor)


def _svd(g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if g.ndim != 2:
        raise ValueError(f"expected a matrix, got shape {g.shape}")
    return scipy.linalg.svd(np.asarray(g, dtype=np.float64), full_matrices=False,
                            lapack_driver="gesvd")


def _svd_large(g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The SVD of a large matrix the Gram path does not take: LAPACK's divide and conquer (gesdd), whose
    singular vectors are BLAS-3 work (one thread, 512 x 1024: 0.5 s against gesvd's 3.9 s; the gpu tier's
    low-rank 4096 x 2048: 15.6 s against 139 s), agreeing with gesvd to 1e-12 on the tests' rank-deficient and
    ill-conditioned matrices; gesvd where gesdd does not converge (its known rare failure)."""
    try:
        return scipy.linalg.svd(g, full_matrices=False, lapack_driver="gesdd")
    except np.linalg.LinAlgError:
        return _svd(g)


GRAM_MIN_SIDE = 512
"""Matrices whose short side is at least this may take the Gram path and are memoised; smaller ones
(every CI and nightly layer: the largest short side there is 96) keep the plain SVD, bit for bit."""
GRAM_RTOL = 1e-13
"""The Gram path is taken where its first-order error bound (`_gram_error`), normwise relative to the
result, is at most this: 10x below the 1e-12 the Gram path is tested to agree with the SVD to."""
GRAM_EIGH_ERROR = 16 * float(np.finfo(np.float64).eps)
"""The error assumed of each eigenvalue of the Gram matrix, relative to the largest: a backward stable
symmetric eigensolver returns those of G + E, ||E||_2 a small multiple of eps ||G||_2. Calibrated: on
256 x 512 Gaussian and geometric-spectrum matrices (condition 5-10) the Gram path's measured distance
from gesvd is 0.1-0.3 x the bound this gives (a few eps per eigenvalue); on the gpu tier's 2048 x 4096,
4096 x 2048 and 2048 x 4608 directions 1.4-1.6e-14."""
GRAM_MAX_CONDITION = 10.0
"""The Gram path also needs the smallest singular value at least 1/GRAM_MAX_CONDITION of the largest
(its eigenvalue at least 1e-2 of the largest, resolved far above the eigensolver's ~eps l_max): a
rank-deficient or ill-conditioned matrix always takes the SVD. The gpu tier's Gaussian directions
(aspect 2 and more) have s_max / s_min ~ 5-6; its low-rank one (1e-2 tail) takes the SVD."""
CACHE_SIZE = 6
"""Decompositions of large matrices kept (one 2048 x 4096 matrix's Gram decomposition: 32 MiB)."""


@dataclass(frozen=True)
class _Gram:
    """A = (Q h(L) Q^T applied on A's short side): the Gram matrix of A's short side, Q L Q^T,
    eigenvalues ascending (a few may be slightly negative: rounding)."""

    q: np.ndarray
    lam: np.ndarray
    wide: bool


@dataclass(frozen=True)
class _SVD:
    u: np.ndarray
    s: np.ndarray
    vt: np.ndarray


_CACHE: "OrderedDict[tuple, Union[_Gram, _SVD]]" = OrderedDict()


def clear_cache() -> None:
    """Forget every memoised decomposition."""
    _CACHE.clear()


def path(g: np.ndarray) -> str:
    """How the last decomposition of `g` was memoised: "gram", "svd", or "" (not memoised: small, or
    not decomposed yet, or evicted)."""
    if not _large(g):
        return ""
    key = _key(_normalised(np.asarray(g, dtype=np.float64))[0])
    return "gram" if key in _CACHE else "svd" if key + ("svd",) in _CACHE else ""


def _large(g: np.ndarray) -> bool:
    return g.ndim == 2 and min(g.shape) >= GRAM_MIN_SIDE


def _normalised(g: np.ndarray) -> tuple[np.ndarray, int]:
    """(g / 2^e, e), with 2^e the power of two at g's largest |entry| (2^1023 above it: 2^1024 is no
    float) when that division is exact (no entry lost to the subnormal range), else (g, 0): the gradients
    x 2^10 of `scale` then share the decomposition of the run without, and the Gram matrix of a finite g
    overflows only where g stays unscaled (its criterion then rejects the infinite eigenvalues: the SVD).
    (A product by a power of two: np.ldexp is ~10x slower.)"""
    top = max(float(np.max(g, initial=0.0)), -float(np.min(g, initial=0.0)))
    e = min(math.frexp(top)[1], 1023)  # 0 for a zero or non-finite top, as for one in [0.5, 1)
    if e == 0 or e < -1000:
        return g, 0
    scaled = g * math.ldexp(1.0, -e)
    return (scaled, e) if np.array_equal(scaled * math.ldexp(1.0, e), g) else (g, 0)


def _key(g: np.ndarray) -> tuple:
    return (g.shape, hashlib.sha256(np.ascontiguousarray(g).view(np.uint8)).digest())


def _remember(key: tuple, value: Union[_Gram, _SVD]) -> Union[_Gram, _SVD]:
    _CACHE[key] = value
    _CACHE.move_to_end(key)
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return value


def _gram(g: np.ndarray) -> _Gram:
    wide = g.shape[0] <= g.shape[1]
    gram = g @ g.T if wide else g.T @ g
    lam, q = scipy.linalg.eigh(gram, driver="evd", overwrite_a=True, check_finite=False)
    return _Gram(q, lam, wide)


def _decompose(base: np.ndarray, accept: Callable[[_Gram], bool]) -> Union[_Gram, _SVD]:
    """The decomposition of a large finite matrix `base` (a `_normalised` one): its Gram decomposition
    where `accept` takes it, else its SVD; memoised by content (a rejected Gram decomposition is not kept)."""
    key = _key(base)
    gram = _CACHE.get(key)
    if isinstance(gram, _Gram) and accept(gram):
        _CACHE.move_to_end(key)
        return gram
    svd = _CACHE.get(key + ("svd",))
    if svd is not None:
        _CACHE.move_to_end(key + ("svd",))
        return svd
    if gram is None:
        gram = _gram(base)
        if accept(gram):
            return _remember(key, gram)
    return _remember(key + ("svd",), _SVD(*_svd_large(base)))


def _memoised(g: np.ndarray, accept: Callable[[_Gram, float], bool]) -> tuple[Union[_Gram, _SVD], float] | None:
    """For a large finite `g`: (the memoised decomposition of g / factor, factor), factor the power of two
    `_normalised` divides by, with the Gram path where `accept(gram, factor)` takes it (`_decompose`); None
    for a small or non-finite `g` (the caller's plain SVD)."""
    if not (_large(g) and np.all(np.isfinite(g))):
        return None
    base, e = _normalised(np.asarray(g, dtype=np.float64))
    factor = math.ldexp(1.0, e)
    return _decompose(base, lambda gram: accept(gram, factor)), factor


def _spectrum_of(gram: _Gram) -> np.ndarray:
    """Singular values (ascending, rounding negatives clipped) of the matrix of `gram`."""
    return np.sqrt(np.maximum(gram.lam, 0.0))


def _apply(gram: _Gram, h: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Q diag(h) Q^T applied to g on its short side."""
    w = (gram.q * h) @ gram.q.T
    return w @ g if gram.wide else g @ w


def _schedule_h(schedule: Sequence[Coefficients], lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(h(l), h'(l)) with f(x) = x h(x^2), f the composed schedule, at normalised squared singular values l:
    r_0 = 1, r_{k+1} = r_k (a + t (b + c t)) with t = l r_k^2."""
    r, dr = np.ones_like(lam), np.zeros_like(lam)
    for a, b, c in schedule:
        t = lam * r * r
        dt = r * r + 2.0 * lam * r * dr
        r, dr = r * (a + t * (b + c * t)), dr * (a + t * (b + c * t)) + r * (b + 2.0 * c * t) * dt
    return r, dr


def _well_conditioned(lam: np.ndarray) -> bool:
    """Eigenvalues (ascending) of a Gram matrix whose matrix has s_min >= s_max / GRAM_MAX_CONDITION."""
    return bool(lam.size and lam[-1] > 0.0 and lam[0] >= lam[-1] / GRAM_MAX_CONDITION**2)


def _gram_error(lam: np.ndarray, h: np.ndarray, dh: np.ndarray) -> float:
    """First-order bound of the Gram path's normwise relative error: each eigenvalue l_i of the Gram
    matrix off by GRAM_EIGH_ERROR l_max moves the result's singular value s_i h(l_i) by
    s_i |h'(l_i)| GRAM_EIGH_ERROR l_max; over ||(s_i h(l_i))||. For the polar factor, h = l^-1/2: the
    bound is GRAM_EIGH_ERROR kappa^2 / 2 (root mean square over the singular values), so within
    GRAM_RTOL up to kappa ~ 7-8; a polynomial map's saturates where f is flat (up to kappa ~ 10)."""
    lam = np.maximum(lam, 0.0)
    size = float(np.sqrt(np.sum(lam * h * h)))
    if not size or not np.all(np.isfinite(dh)):
        return math.inf
    return GRAM_EIGH_ERROR * float(lam.max()) * float(np.sqrt(np.sum(lam * dh * dh))) / size


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


def _within_range(g: np.ndarray) -> tuple[np.ndarray, float]:
    """(g, 1.0), or (g / factor, factor) with `_normalised`'s power of two where g's singular values (at
    most max|g| sqrt(size)) could exceed a quarter of fp64's largest value."""
    top = float(np.max(np.abs(g), initial=0.0))
    if not top * math.sqrt(g.size) > np.finfo(np.float64).max / 4:
        return g, 1.0
    base, e = _normalised(g)
    return base, math.ldexp(1.0, e)


def spectral_map(g: np.ndarray, schedule: Sequence[Coefficients], normaliser: Normaliser) -> np.ndarray:
    """Exact result of the polynomial iteration `schedule` started from normalised `g` (Gram path for a
    large matrix where its error bound allows: module doc). Formed from g / factor and d / factor (a power
    of two: the same bits), so a g whose norm exceeds fp64's range maps too."""
    def normalised_h(gram: _Gram, factor: float) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """(d / factor, eigenvalues of (g/d)(g/d)^T, h, h' there) at this matrix's own scale."""
        d = normaliser.scaled_denominator(frobenius(_spectrum_of(gram)), factor)
        lam = gram.lam * (1.0 / d) ** 2 if d else gram.lam
        return (d, lam, *_schedule_h(schedule, lam))

    def accept(gram: _Gram, factor: float) -> bool:
        d, lam, h, dh = normalised_h(gram, factor)
        return d != 0.0 and _well_conditioned(gram.lam) and _gram_error(lam, h, dh) <= GRAM_RTOL

    found = _memoised(g, accept)
    if found is None:
        base, factor = _within_range(g)
        u, s, vt = _svd(base)
    else:
        dec, factor = found
        if isinstance(dec, _Gram):
            d, _, h, _ = normalised_h(dec, factor)
            return _apply(dec, h, np.asarray(g, dtype=np.float64) / factor / d)
        u, s, vt = dec.u, dec.s, dec.vt
    d = normaliser.scaled_denominator(frobenius(s), factor)
    if d == 0.0:
        return np.zeros_like(g, dtype=np.float64)
    return (u * compose(schedule, s / d)) @ vt


def _polar_ok(gram: _Gram, rcond: float) -> bool:
    """The Gram path for the polar factor: well conditioned (`_well_conditioned`), every singular value at least RANK_GAP (4) x
    above the rank cut-off (so the rank decision is the SVD's), and the error bound within GRAM_RTOL."""
    lam = gram.lam
    if not _well_conditioned(lam):
        return False
    s = np.sqrt(lam)
    if s[0] <= 4.0 * rcond * s[-1]:
        return False
    return _gram_error(lam / lam[-1], (lam / lam[-1]) ** -0.5, -0.5 * (lam / lam[-1]) ** -1.5) <= GRAM_RTOL


def polar_factor(g: np.ndarray, rcond: float) -> np.ndarray:
    """U V^T over the singular values above rcond * s_max (zero matrix -> zero); Gram path for a large,
    well-conditioned matrix (module doc, `_polar_ok`). From g / factor where g's singular values could
    overflow (`_within_range`): the same U V^T."""
    found = _memoised(g, lambda gram, factor: _polar_ok(gram, rcond))
    if found is None:
        u, s, vt = _svd(_within_range(g)[0])
    else:
        dec, factor = found
        if isinstance(dec, _Gram):
            return _apply(dec, dec.lam ** -0.5 / factor, np.asarray(g, dtype=np.float64))  # (lam factor^2)^-1/2
        u, s, vt = dec.u, dec.s, dec.vt  # the singular values of g / factor: the cut-off is relative
    if s.size == 0 or s[0] == 0.0:
        return np.zeros_like(g, dtype=np.float64)
    keep = s > rcond * s[0]
    return (u[:, keep]) @ vt[keep, :]


def _values_ok(gram: _Gram) -> bool:
    """Singular values from the Gram eigenvalues: each s_i = sqrt(l_i) is off by GRAM_EIGH_ERROR
    l_max / (2 l_i) of itself at most (first order); taken where that is within GRAM_RTOL for all."""
    lam = gram.lam
    return bool(_well_conditioned(lam) and GRAM_EIGH_ERROR * lam[-1] / (2.0 * lam[0]) <= GRAM_RTOL)


def singular_values(g: np.ndarray) -> np.ndarray:
    """Singular values of a matrix, descending, in FP64 (from the memoised decomposition for a large
    matrix: module doc)."""
    found = _memoised(g, lambda gram, factor: _values_ok(gram))
    if found is not None:
        dec, factor = found
        return (_spectrum_of(dec)[::-1] if isinstance(dec, _Gram) else dec.s) * factor
    return scipy.linalg.svd(np.asarray(g, dtype=np.float64), compute_uv=False, lapack_driver="gesvd")

