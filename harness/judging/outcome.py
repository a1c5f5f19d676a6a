"""What a check returns (`Outcome`), the worst step's evidence for the report's pictures, and the
helpers every check uses to pick and describe its worst step."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from harness.judging.metrics import Metrics
from harness.policy.tolerance import Tolerance

Trajectory = list[list[torch.Tensor]]
"""traj[k][i]: member i after step k."""


@dataclass(frozen=True)
class Evidence:
    """The worst step of a reference check: where it is, and the judged and the reference update
    (new minus previous parameter) in the [out, prod(rest)] view, in FP64."""

    where: str
    judged: np.ndarray
    reference: np.ndarray

    @classmethod
    def of(cls, where: str, x_prev: np.ndarray, x_new: np.ndarray, x_ref: np.ndarray) -> "Evidence":
        rows = x_prev.shape[0]
        return cls(where, (x_new - x_prev).reshape(rows, -1), (x_ref - x_prev).reshape(rows, -1))


@dataclass(frozen=True)
class Outcome:
    check: str
    metrics: Metrics
    tolerance: Tolerance | None
    message: str
    skipped: bool = False
    evidence: Evidence | None = None
    """The worst step's updates, for the report's pictures (reference checks)."""
    unsupported: bool = False
    run: Trajectory | None = None
    """The other run of the case's inputs this check judged the target by, kept for the diagnosis
    (harness/judging/diagnosis.py): `scale` and `rescale` the run with gradients x 2^10, `equiv2d` the
    [out, prod(rest)] run in the case's shape."""

    @property
    def status(self) -> str:
        if self.unsupported:
            return "unsupported"
        if self.skipped:
            return "skipped"
        return "pass" if self.metrics.ratio <= 1.0 else "fail"


NO_METRICS = Metrics(math.nan, math.nan, math.nan, math.nan, math.nan)


Where = TypeVar("Where")


def worst_of(pairs: list[tuple[Metrics, Where]]) -> tuple[Metrics, Where]:
    """The (metrics, where) pair with the largest ratio (NaN counts as worst); the first on ties."""
    return max(pairs, key=lambda pair: pair[0].severity)


def describe(metrics: Metrics, where: str, tol: Tolerance) -> str:
    """The worst step in words; rel_err is set against the whole allowance (rtol plus the storage
    rounding, harness.judging.metrics), which is what it passes or fails by."""
    verdict = "within" if metrics.ratio <= 1.0 else "BEYOND"
    against = (f" vs allowed {metrics.rel_err / metrics.ratio:.3g}"
               if 0.0 < metrics.ratio < math.inf and math.isfinite(metrics.rel_err) else "")
    return (f"worst at {where}: ||err|| = {metrics.ratio:.3g} x allowed ({verdict} tolerance); "
            f"rel_err {metrics.rel_err:.3g}{against} (rtol {tol.rtol:g} + storage rounding), "
            f"max_abs {metrics.max_abs:.3g}, max_ulp {metrics.max_ulp:.3g}")


def worst_judged(judged: list[tuple[Metrics, Where, Tolerance]]) -> tuple[Metrics, Where, Tolerance]:
    """The (metrics, where, tolerance) triple with the largest ratio (NaN counts as worst); the first on ties."""
    return max(judged, key=lambda t: t[0].severity)
