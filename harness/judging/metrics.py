"""Error metrics between an implementation's step and the reference, all in FP64.

Compared per step on the *update* (new minus previous parameter), not the
parameter: parameters dwarf updates and would hide update errors.

  err      = delta_target - delta_ref
  max_abs  = max |err|
  rel_err  = ||err||_F / ||delta_ref||_F          (0 if both are 0, inf if only delta_ref is)
  max_ulp  = max |x_target - x_ref| / ulp_param(x_ref)   (inf where the count passes float64's range:
                                                        near 0, fp64's ulp is 2^-1074)
  allowed  = rtol ||delta_ref||_F + storage_ulps ||ulp_param(x_ref)||_F
  ratio    = ||err||_F / allowed                  (pass iff ratio <= 1)

The storage term is the rounding a parameter of its dtype must suffer when the
new value is written (two roundings of at most half an ulp each).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from oracles.rounding import ulp


@dataclass(frozen=True)
class Metrics:
    max_abs: float
    rel_err: float
    max_ulp: float
    allowed: float
    ratio: float

    @property
    def severity(self) -> float:
        """The ratio to rank by: NaN (nothing comparable) ranks as worst."""
        return math.inf if math.isnan(self.ratio) else self.ratio


def _ulps(distance: np.ndarray, spacing: np.ndarray) -> np.ndarray:
    """distance / spacing for a power-of-two `spacing`, exactly (an exponent shift), and inf where the
    quotient passes float64's range: a plain division would overflow there, with a warning."""
    mantissa, exponent = np.frexp(distance)
    shift = exponent - (np.frexp(spacing)[1] - 1)
    beyond = (shift > np.finfo(np.float64).maxexp) & (mantissa != 0)  # mantissa < 1: 2^maxexp times it fits
    return np.where(beyond, np.inf, np.ldexp(mantissa, np.minimum(shift, np.finfo(np.float64).maxexp)))


def _safe_div(num: float, den: float) -> float:
    if den > 0.0:
        return num / den
    return 0.0 if num == 0.0 else math.inf


def compare_step(x_prev: np.ndarray, x_new: np.ndarray, x_ref: np.ndarray, param_dtype: str,
                 rtol: float, storage_ulps: float) -> Metrics:
    """Metrics of one parameter's step: x_prev -> x_new (judged) vs x_prev -> x_ref (expected).

    Also serves relations (two runs that must agree); rtol = storage_ulps = 0 demands bitwise equality.
    """
    if not (np.all(np.isfinite(x_new)) and np.all(np.isfinite(x_ref))):
        return Metrics(math.inf, math.inf, math.inf, math.nan, math.inf)
    err = (x_new - x_prev) - (x_ref - x_prev)
    err_norm = float(np.linalg.norm(err))
    ref_norm = float(np.linalg.norm(x_ref - x_prev))
    spacing = ulp(x_ref, param_dtype)
    allowed = rtol * ref_norm + storage_ulps * float(np.linalg.norm(spacing))
    return Metrics(max_abs=float(np.max(np.abs(err), initial=0.0)),
                   rel_err=_safe_div(err_norm, ref_norm),
                   max_ulp=float(np.max(_ulps(np.abs(x_new - x_ref), spacing), initial=0.0)),
                   allowed=allowed,
                   ratio=_safe_div(err_norm, allowed))
