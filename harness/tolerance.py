"""The tolerance policy: one table keyed by (parameter dtype, compute dtype,
orthogonalizer), each entry with its reason and the measured errors behind it.

A tolerance bounds the normwise relative error of an update (see harness.metrics):
  ||err||_F <= rtol ||delta_ref||_F + STORAGE_ULPS ||ulp_param(x_ref)||_F
Relations between two runs of the same inputs (megabatch, equivalent 2-D) use the same entry
doubled (each run may sit rtol away from the truth on opposite sides), except
runs of the same arithmetic in fp64, which must agree bitwise.

The `measured` column is the worst rtol optimizers.Muon needed against the FP64
oracle over the nightly tier on CPU (benchmarks/measure_tolerances.py); each rtol
sits at least 2x above it. Overrides change an entry for matching cases and say so
in every record's tolerance_source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from cases import Case, matrix_shape

STORAGE_ULPS = 1.0
"""Writing X <- X(1 - lr wd) - lr s O into the parameter dtype rounds twice, half an ulp each."""


@dataclass(frozen=True)
class Entry:
    """rtol for well-conditioned gradients; ill_rtol for ill-conditioned ones (ILL_CONDITIONED)."""

    rtol: float
    ill_rtol: float
    reason: str
    measured: str


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    storage_ulps: float
    source: str


@dataclass(frozen=True)
class Override:
    """A change of the policy rtol for the cases where `applies(case, compute_dtype)` holds.

    factor > 1 loosens, < 1 tightens; either way the record's tolerance_source says so and why.
    """

    applies: Callable[[Case, str], bool]
    factor: float
    reason: str
    measured: str


def _rank_one_polar_express_bf16(case: Case, compute_dtype: str) -> bool:
    rank_one = min(matrix_shape(case.shape, case.flatten)[1:]) == 1
    return rank_one and case.orthogonalizer == "polar_express" and compute_dtype == "bf16"


ILL_CONDITIONED = 30.0
"""A case is ill-conditioned when some gradient matrix has s_max/s_min above this: its small
singular values sit where the polynomial is steep (f'(0) ~ 490 for the quintic, ~970 for Polar
Express) and the SVD's singular vectors are sensitive. Gaussian matrices of the CI shapes have
condition 3-8; the "lowrank" gradients have 100, "rankdef" ones infinity; small square ones vary."""

ILL_POSED_BF16 = 2.0**8
"""Above this condition number (1/u of bf16) with bf16 in the case, the smallest singular values
are below bf16's resolution: rounding fills them with noise that the polynomial maps to O(1)
values (measured rtol needed 0.34-0.43 for rank-deficient gradients), so the reference comparison
is ill-posed and is skipped (finiteness is still judged)."""

_F64 = "fp64 arithmetic (u = 1.1e-16), error grows with the polynomial's slope"
_F32 = "fp32 arithmetic (u = 6e-8), five matrix-polynomial steps"
_B16P = "bf16 momentum buffer (u = 2^-9) feeds the orthogonalizer; storage rounding has its own term"
_B16C = "bf16 arithmetic (u = 2^-9) in every Gram product and polynomial step"

POLICY: dict[tuple[str, str, str], Entry] = {
    # (param, compute, orthogonalizer): Entry(rtol, ill_rtol, reason, measured worst: well / ill)
    ("fp64", "fp64", "newton_schulz"): Entry(1e-14, 1e-13, _F64, "4.3e-15 / 3.3e-14"),
    ("fp64", "fp64", "polar_express"): Entry(5e-14, 2e-13, _F64, "1.3e-14 / 7.0e-14"),
    ("fp64", "fp64", "svd"): Entry(5e-15, 5e-14, "LAPACK vs torch SVD in fp64", "1.8e-15 / 2.4e-14"),
    ("fp64", "fp32", "newton_schulz"): Entry(5e-6, 5e-5, _F32, "1.8e-6 / 1.0e-5"),
    ("fp64", "fp32", "polar_express"): Entry(2e-5, 5e-5, _F32, "5.6e-6 / 1.8e-5"),
    ("fp64", "fp32", "svd"): Entry(2e-6, 5e-5, "fp32 SVD; small singular gaps rotate vectors", "9.8e-7 / 1.3e-5"),
    ("fp32", "fp32", "newton_schulz"): Entry(5e-6, 5e-5, _F32, "1.2e-6 / 9.6e-6"),
    ("fp32", "fp32", "polar_express"): Entry(2e-5, 5e-5, _F32, "5.2e-6 / 1.8e-5"),
    ("fp32", "fp32", "svd"): Entry(2e-6, 5e-5, "fp32 SVD; small singular gaps rotate vectors", "5.3e-7 / 1.3e-5"),
    ("fp32", "bf16", "newton_schulz"): Entry(0.1, 0.2, _B16C, "2.8e-2 / 7.3e-2"),
    ("fp32", "bf16", "polar_express"): Entry(0.2, 0.25, _B16C + "; Polar Express's first step has larger "
                                             "coefficients, so more cancellation", "9.5e-2 / 1.1e-1"),
    ("bf16", "fp32", "newton_schulz"): Entry(2e-3, 0.2, _B16P, "0 / 5.1e-2"),
    ("bf16", "fp32", "polar_express"): Entry(5e-3, 0.1, _B16P, "2.4e-3 / 4.3e-2"),
    ("bf16", "fp32", "svd"): Entry(2e-3, 0.1, _B16P, "0 / 3.6e-2"),
    ("bf16", "bf16", "newton_schulz"): Entry(5e-2, 0.2, _B16C + "; " + _B16P, "1.5e-2 / 7.7e-2"),
    ("bf16", "bf16", "polar_express"): Entry(0.2, 0.25, _B16C + "; " + _B16P, "9.4e-2 / 9.6e-2"),
}
"""Measured worst: the largest rtol a case needed (benchmarks/measure_tolerances.py, nightly tier,
2813 cases, CPU, 2026-11-29), over well- / ill-conditioned gradient matrices (ILL_CONDITIONED).
Each rtol is at least 2x its measured worst, rounded up to 1-2-5 (0.25 where 0.5 would be loose
enough to pass a layer-mixing bug, whose normwise error is ~0.7)."""

def _normuon_bf16(case: Case, compute_dtype: str) -> bool:
    rank_one = min(matrix_shape(case.shape, case.flatten)[1:]) == 1
    return case.optimizer == "normuon" and "bf16" in (case.param_dtype, compute_dtype) and not rank_one


OVERRIDES: tuple[Override, ...] = (
    Override(applies=_rank_one_polar_express_bf16, factor=3.0,
             reason="rank-1 matrix: its one normalised singular value sits at 1/1.01, where Polar Express's "
                    "first polynomial sums terms of ~20 to ~1.4, and bf16 keeps 8 bits",
             measured="2.6e-1 (fp32@bf16), 1.6e-1 (bf16@bf16)"),
    Override(applies=_normuon_bf16, factor=2.0,
             reason="NorMuon divides each row by sqrt(v) + eps and rescales, so a row whose bf16 rounding "
                    "error is large relative to its own size carries that error into the whole update",
             measured="1.3e-1 well / 1.1e-1 ill (bf16@bf16), 1.4e-1 well (fp32@bf16), 7.9e-2 ill (bf16@fp32)"),
)


def lookup(param_dtype: str, compute_dtype: str, orthogonalizer: str, ill_conditioned: bool = False) -> Tolerance:
    """The policy tolerance for one key; KeyError names a key the policy lacks."""
    key = (param_dtype, compute_dtype, orthogonalizer)
    if key not in POLICY:
        raise KeyError(f"tolerance policy has no entry for {key}")
    entry = POLICY[key]
    rtol = entry.ill_rtol if ill_conditioned else entry.rtol
    kind = (f"ill-conditioned gradient (condition > {ILL_CONDITIONED:g}), loosened from {entry.rtol:g}"
            if ill_conditioned else "well-conditioned gradient")
    return Tolerance(rtol, STORAGE_ULPS, f"policy {param_dtype}@{compute_dtype}/{orthogonalizer} ({kind}): "
                                         f"rtol {rtol:g}; {entry.reason}; measured worst {entry.measured}")


def for_case(case: Case, condition: float, compute_dtype: str | None = None) -> Tolerance:
    """Tolerance of the reference check of `case` whose gradients have worst condition number
    `condition` (compute dtype as the target declares it)."""
    compute = compute_dtype or case.compute_dtype
    tol = lookup(case.param_dtype, compute, case.orthogonalizer, condition > ILL_CONDITIONED)
    for override in OVERRIDES:
        if override.applies(case, compute):
            verb = "loosened" if override.factor > 1 else "tightened"
            tol = Tolerance(tol.rtol * override.factor, tol.storage_ulps,
                            f"{tol.source}; {verb} x{override.factor:g}: {override.reason} "
                            f"(measured worst {override.measured})")
    return tol


def ill_posed(case: Case, condition: float) -> str | None:
    """Why the reference comparison of `case` is ill-posed, or None."""
    if condition > ILL_POSED_BF16 and "bf16" in (case.param_dtype, case.compute_dtype):
        return (f"ill-posed: gradient condition number {condition:.3g} > {ILL_POSED_BF16:g} = 1/u(bf16); its "
                f"smallest singular values are bf16 rounding noise that the orthogonalizer maps to O(1)")
    return None


def for_relation(case: Case, condition: float, same_arithmetic: bool, compute_dtype: str | None = None) -> Tolerance:
    """Tolerance of a relation between two runs of the target on the same inputs of `case`;
    `same_arithmetic`: both runs apply the same kernels (exact in fp64)."""
    compute = compute_dtype or case.compute_dtype
    if same_arithmetic and compute == "fp64" and case.param_dtype == "fp64":
        return Tolerance(0.0, 0.0, "exact: two runs of the same arithmetic in fp64 must agree bitwise")
    base = for_case(case, condition, compute)
    return Tolerance(2.0 * base.rtol, 2.0 * base.storage_ulps, f"2 x {base.source}")
