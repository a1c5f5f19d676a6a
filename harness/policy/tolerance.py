"""The tolerance policy: an rtol per reference step, derived from the spectrum of the matrix the
step orthogonalizes, scaled by a coefficient measured per class of the declared arithmetic.

A tolerance bounds the normwise relative error of an update (see harness.judging.metrics):
  ||err||_F <= rtol ||delta_ref||_F + STORAGE_ULPS ||ulp_param(x_ref)||_F

For member i at step k of a case, judged on device class D:
  rtol = max(c(key) * u * max(1, A), RTOL_FLOOR_UNITS * u(floor format))
  floor format: the coarsest of the declared compute format and the formats the target DECLARES it
         holds its scalars in (lr: Conventions.lr_dtype; the momentum coefficients: the opmath of
         Conventions.state_dtype). The oracle rounds each scalar to its format once; a target that
         forms one by another formula in that format (heavyball's bias correction through expm1 and
         log1p in fp32) lands a few of its units away: real, harmless, within the floor, and said so
         in the source. It moves only fp64 compute with fp32 scalars.
  u    = unit roundoff of the coarser of the parameter format (the momentum buffer the target keeps)
         and the compute format the target DECLARES (Conventions.compute_dtype);
  A    = amplification of the declared orthogonalizer at the singular values of that step's
         direction U (harness/policy/sensitivity.py): slopes and cancellation of a polynomial schedule,
         s_max / s_min of the kept singular values for the polar factor;
  c    = coefficient of the key (harness/policy/keys.py coefficient_key: optimizer, param@compute,
         schedule, conditioning class): the allowance of the worst c a correct implementation needed
         on D (harness/policy/allowance.py, kind "coefficient"), from the table tolerance_<D>.json
         (harness/policy/tables.py; harness/policy/calibrate/coefficients.py writes it). Where the
         key's algorithm takes every step of another (Dion2 with fraction 1 is Muon:
         harness/algorithms `includes`), the worse of its worst and that algorithm's same key's.
A device class without its own measurement uses the CPU one and says so in every source.

Not judged (the harness's gap, never the target's fault):
  - no measurement for the key: the reference check is "unsupported" ("the tolerance policy has no
    entry for ...");
  - ill-posed: a derived rtol above ILL_POSED_RTOL (rounding alone could then move the update as
    far as a real bug does), or an SVD rank cut-off among the singular values: "skipped" with why.

Relations between two runs of the target on the same inputs (megabatch, equivalent 2-D) use twice
the worst step's tolerance (each run may sit rtol away from the truth on opposite sides), except
runs of the same arithmetic in fp64, which must agree bitwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from cases import Case, matrix_shape
from harness.algorithms import algorithm
from harness.policy import allowance, tables
from harness.policy.bounds import EXACT, STORAGE_ULPS, Tolerance
from harness.policy.ill_posed import ILL_POSED_RTOL
from harness.policy.keys import Key, coefficient_key, schedule_name
from harness.policy.sensitivity import Sensitivity, of_case
from oracles import Conventions
from oracles.rounding import machine_epsilon, opmath

DEVICE_CLASSES = ("cpu", "cuda")
FALLBACK_DEVICE = "cpu"
STATISTIC = "c"
"""The statistic a coefficient table's entries hold: the coefficient c a step needed."""

RTOL_FLOOR_UNITS = 8.0
"""No step's rtol is below 8 unit roundoffs of the declared compute format: the orthogonalizer's own
arithmetic costs that much even where A and the measured c are ~0 (a 4-rank Shard(1) piece of a
rank-1 fp64 SVD step measured 6.5 u, its key's 24 measured cases 0)."""

ILL_CONDITIONED = 30.0
"""Conditioning class "ill": some orthogonalized matrix has s_max / s_min above this. Gaussian directions
of the CI shapes have 3-20; "lowrank" gradients give ~100, "rankdef" ones up to infinity at step 1."""


def table_name(device: str) -> str:
    """The file of device class `device`'s coefficient table (harness/policy/data)."""
    return f"tolerance_{device}.json"


def evidence(device: str) -> tables.Table | None:
    """The coefficient table of device class `device`, or None if there is none."""
    return tables.load(table_name(device))


def unit_roundoff(fmt: str) -> float:
    """u = half the machine epsilon of `fmt` (round to nearest)."""
    return machine_epsilon(fmt) / 2.0


def conditioning_class(case: Case, sensitivities: Sequence[Sequence[Sensitivity]]) -> str:
    """"elementwise" for an algorithm that orthogonalizes nothing; "rank-1" when every matrix orthogonalized
    is 1 x n or n x 1 (one singular value, at the top of the normalised range: a 1 x n layer, or Dion2
    selecting one slice), else "well" / "ill" by the worst condition number of the case's orthogonalized
    directions."""
    if algorithm(case).elementwise:
        return "elementwise"
    shapes = [s.shape for row in sensitivities for s in row]
    if (min(matrix_shape(case.shape, case.flatten)[1:]) == 1
            or (shapes and all(min(shape) == 1 for shape in shapes))):
        return "rank-1"
    worst = max((s.condition for row in sensitivities for s in row), default=1.0)
    return "ill" if worst > ILL_CONDITIONED else "well"


def coefficient(worst: float) -> float:
    """c of a key from its measured worst (the "coefficient" safety rule)."""
    return allowance.allowance("coefficient", worst)


class NoEntry(LookupError):
    """The policy has no measurement for a key: a gap of the harness, never of the target. `ill_posed`:
    why no entry could judge the case anyway (unmeasurable_why), or empty."""

    def __init__(self, message: str, ill_posed: str = "") -> None:
        super().__init__(message)
        self.ill_posed = ill_posed


def unmeasurable_why(case: Case, conv: Conventions, sensitivities: Sequence[Sequence[Sensitivity]]) -> str:
    """Why no coefficient could judge the case's reference steps, whatever was measured, or "": an SVD
    rank cut-off among a direction's singular values, or an rtol above ILL_POSED_RTOL at the least
    coefficient any key has (the safety rule's floor). The calibration leaves such runs out, so a key
    that only they reach has no entry."""
    for row in sensitivities:
        for s in row:
            if s.ambiguous_rank:
                return f"ill-posed: {s.ambiguous_rank}"
    u = unit_roundoff(max((case.param_dtype, conv.compute_dtype), key=unit_roundoff))
    worst = max((max(1.0, s.amplification) for row in sensitivities for s in row), default=1.0)
    floor = allowance.SAFETY["coefficient"].floor
    if floor * u * worst > ILL_POSED_RTOL:
        return (f"ill-posed: rtol {floor * u * worst:.3g} at the least coefficient any key has ({floor:g} x u "
                f"{u:.3g} x amplification {worst:.3g}) exceeds {ILL_POSED_RTOL:g}")
    return ""


@dataclass(frozen=True)
class CasePolicy:
    """The tolerances of one case's reference steps: rtol = coefficient * u * max(1, A[i][k])."""

    key: Key
    u: float
    u_format: str
    coefficient: float
    measured: tables.Entry
    evidence_note: str
    sensitivities: list[list[Sensitivity]]
    floor_format: str

    def floor(self) -> float:
        return RTOL_FLOOR_UNITS * unit_roundoff(self.floor_format)

    def rtol(self, amplification: float) -> float:
        return max(self.coefficient * self.u * max(1.0, amplification), self.floor())

    def _source(self, s: Sensitivity, prefix: str = "") -> str:
        rtol = self.rtol(s.amplification)
        at_floor = rtol == self.floor()
        scalars = "" if self.floor_format == self.key.compute_dtype else " (its declared lr or momentum scalars)"
        floored = f" (floor {RTOL_FLOOR_UNITS:g} u({self.floor_format}){scalars}; derived" if at_floor else " ="
        closing = ")" if at_floor else ""
        return (f"{prefix}derived {self.key}: rtol {rtol:.3g}{floored} c {self.coefficient:g} x "
                f"u({self.u_format}) {self.u:.3g} x amplification {max(1.0, s.amplification):.3g} of the "
                f"orthogonalized direction (condition {s.condition:.3g}); c is {allowance.describe('coefficient')} "
                f"{self.measured.worst[STATISTIC]:.3g} measured over {self.measured.n} cases ({self.evidence_note})"
                f"{closing}")

    def at(self, member: int, step: int) -> Tolerance:
        """Tolerance of member `member` at step `step` (0-based)."""
        s = self.sensitivities[member][step]
        return Tolerance(self.rtol(s.amplification), STORAGE_ULPS, self._source(s))

    def worst(self) -> Sensitivity:
        return max((s for row in self.sensitivities for s in row), key=lambda s: s.amplification)

    def ill_posed(self) -> str | None:
        """Why comparing this case with its reference is ill-posed, or None."""
        for row in self.sensitivities:
            for s in row:
                if s.ambiguous_rank:
                    return f"ill-posed: {s.ambiguous_rank}; the kept rank, hence O(1) of the update, is rounding"
        s = self.worst()
        if self.rtol(s.amplification) > ILL_POSED_RTOL:
            return (f"ill-posed: {self._source(s)} exceeds {ILL_POSED_RTOL:g}, where rounding alone moves the "
                    f"update as far as a wrong update would")
        return None


def for_case(case: Case, conv: Conventions, grads: Sequence[Sequence[np.ndarray]], device: str) -> CasePolicy:
    """The policy of `case` as a target declaring `conv` runs it on device class `device` (cpu, cuda),
    from the FP64 gradients grads[k][i]. NoEntry names a key the measurements lack."""
    if device not in DEVICE_CLASSES:
        raise ValueError(f"unknown device class {device!r}; expected one of {DEVICE_CLASSES}")
    sens = of_case(case, conv, grads)
    key = coefficient_key(case, conv, conditioning_class(case, sens))
    found, note = evidence(device), f"measured on {device}"
    if found is None:
        found, note = evidence(FALLBACK_DEVICE), f"{FALLBACK_DEVICE} measurement used on {device}"
    looked_up = tables.lookup(found, key) if found is not None else None
    if looked_up is None:
        named = schedule_name(conv.orthogonalizer) if conv.orthogonalizer.kind == "polynomial" else ""
        measure = f"python -m harness.policy.calibrate.coefficients --device {device}"
        how = (f"name its schedule in harness.policy.keys.SCHEDULES, then measure it: {measure} --schedules NAME"
               if named.startswith("x") else f"measure it: {measure}" + (f" --schedules {named}" if named else ""))
        raise NoEntry(f"the tolerance policy has no entry for {key} on {device} ({how})",
                      unmeasurable_why(case, conv, sens))
    measured, included = looked_up
    u_format = max((case.param_dtype, conv.compute_dtype), key=unit_roundoff)
    floor_format = max((conv.compute_dtype, conv.lr_dtype, opmath(conv.state_dtype)), key=unit_roundoff)
    return CasePolicy(key, unit_roundoff(u_format), u_format, coefficient(measured.worst[STATISTIC]), measured,
                      f"{note}, {found.provenance.get('date', '?')}{included}", sens, floor_format)


def for_relation(case: Case, policy: CasePolicy, same_arithmetic: bool,
                 across_layouts: bool = False) -> Tolerance | str:
    """Tolerance of a relation between two runs of the target on the same inputs of `case`, or why it
    is ill-posed; `same_arithmetic`: both runs apply the same kernels (exact in fp64). Where the case's reference
    is ill-posed, two runs of the same kernels are still judged (at ILL_POSED_RTOL: their roundings are the same
    but for summation order), except `across_layouts` (a gathered distributed run against one process, whose
    memory layouts, hence roundings, differ) under the SVD, whose kept rank then flips."""
    if same_arithmetic and policy.key.compute_dtype == "fp64" and case.param_dtype == "fp64":
        return EXACT
    worst = policy.worst()
    rtol = policy.rtol(worst.amplification)
    if rtol > ILL_POSED_RTOL and not same_arithmetic:
        return f"ill-posed for two runs with different kernels: {policy._source(worst)}"
    if rtol > ILL_POSED_RTOL and across_layouts and policy.key.schedule == "svd":
        return (f"ill-posed for two runs over different layouts: an SVD's kept rank turns on their rounding near its "
                f"cut-off: {policy._source(worst)}")
    capped = min(rtol, ILL_POSED_RTOL)
    note = f" (capped at {ILL_POSED_RTOL:g}: same kernels on the same inputs)" if capped < rtol else ""
    return Tolerance(2.0 * capped, 2.0 * STORAGE_ULPS, f"2 x {policy._source(worst)}{note}")
