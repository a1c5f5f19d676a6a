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
  c    = coefficient of the key (optimizer, param@compute, schedule, conditioning class),
         COEFFICIENT_SAFETY x the worst c a correct implementation needed on D, rounded up to two
         significant digits, at least COEFFICIENT_FLOOR; measured by benchmarks/measure_tolerances.py
         into tolerance_measured/<D>.json. Where the key's algorithm takes every step of another
         (Dion2 with fraction 1 is Muon: harness/algorithms.py `includes`), the worse of its worst
         and that algorithm's same key's.
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

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Sequence

import numpy as np

from cases import Case, matrix_shape
from harness.algorithms import algorithm
from harness.policy.bounds import EXACT, STORAGE_ULPS, Tolerance
from harness.policy.ill_posed import ILL_POSED_RTOL
from harness.policy.sensitivity import Sensitivity, of_case
from oracles import Conventions, Orthogonalizer
from oracles.coefficients import (GNS_SAFETY, POLAR_EXPRESS_4DP, POLAR_EXPRESS_RAW, POLAR_EXPRESS_SAFETY,
                                  POLAR_EXPRESS_SAFETY_102, YOU_QUINTICS, Coefficients, newton_schulz_schedule,
                                  polar_express_schedule, safety_scaled)
from oracles.rounding import machine_epsilon, opmath

MEASURED_DIR = Path(__file__).with_name("data")
"""One JSON file per device class, written by benchmarks/measure_tolerances.py."""

DEVICE_CLASSES = ("cpu", "cuda")
FALLBACK_DEVICE = "cpu"

COEFFICIENT_SAFETY = 2.0
"""c = 2 x the measured worst, rounded up to two significant digits (2x to 2.1x). No more: in bf16 the
first-order amplification overestimates the error ~15x uniformly (measured c 0.05-0.07), so a Gaussian
Polar Express case (A ~ 300) at 2x already sits at rtol ~0.17, below ILL_POSED_RTOL."""

COEFFICIENT_FLOOR = 0.05
"""The least c of any key: 2x the lower end (0.02-0.03) of the measured nonzero worsts. A key whose
measured worst is below half of it (or 0: every case within the storage allowance) has seen too few
cases to go lower: Hypothesis found bf16@fp32 Newton-Schulz Nesterov steps on rank-deficient
gradients needing 0.032 where their key's 11 measured cases reached 0.0085 (c 0.017 then)."""

RTOL_FLOOR_UNITS = 8.0
"""No step's rtol is below 8 unit roundoffs of the declared compute format: the orthogonalizer's own
arithmetic costs that much even where A and the measured c are ~0 (a 4-rank Shard(1) piece of a
rank-1 fp64 SVD step measured 6.5 u, its key's 24 measured cases 0)."""

ILL_CONDITIONED = 30.0
"""Conditioning class "ill": some orthogonalized matrix has s_max / s_min above this. Gaussian directions
of the CI shapes have 3-20; "lowrank" gradients give ~100, "rankdef" ones up to infinity at step 1."""

STEEP_COEFFICIENT = 8.0
"""Schedule class "poly-steep": some step has a coefficient above this in magnitude (Polar Express's
first step: 8.2, -23.6, 17.3), so near s = 1 terms of that size cancel to O(1) and rounding is
amplified beyond what Keller Jordan's quintic (3.4445, -4.775, 2.0315, class "poly-mild") sees."""


def unit_roundoff(fmt: str) -> float:
    """u = half the machine epsilon of `fmt` (round to nearest)."""
    return machine_epsilon(fmt) / 2.0


def schedule_class(spec: Orthogonalizer) -> str:
    """"svd", "poly-steep" or "poly-mild" for a declared orthogonalizer, from its own coefficients;
    "gram-" before a polynomial evaluated by the Gram iteration (its rounding is amplified more)."""
    if spec.kind in ("svd", "none"):
        return "svd" if spec.kind == "svd" else "elementwise"
    peak = max((abs(c) for step in spec.schedule for c in step), default=0.0)
    return ("gram-" if spec.iteration == "gram" else "") + ("poly-steep" if peak > STEEP_COEFFICIENT else "poly-mild")


OWN_SCHEDULES: dict[str, tuple[tuple[Coefficients, ...], float]] = {
    "newton_schulz": (tuple(newton_schulz_schedule(5)), 1.0),
    "polar_express": (tuple(polar_express_schedule(5)), POLAR_EXPRESS_SAFETY),
}
"""The schedules optimizers.Muon runs, by their option names -> (coefficients, normaliser scale): Keller
Jordan's quintic, and Polar Express with its 1.01 safety (either under the Gram iteration too). Their
keys carry the schedule class alone."""

SCHEDULES: dict[str, tuple[tuple[Coefficients, ...], float]] = {
    "you": (YOU_QUINTICS, 1.0),
    "pe102": (POLAR_EXPRESS_SAFETY_102, 1.02),
    "pe105": (safety_scaled(POLAR_EXPRESS_RAW[:5], GNS_SAFETY), 1.0),
    "pe4dp": (POLAR_EXPRESS_4DP, 1.0),
}
"""Every other schedule a built-in adapter declares, by the name its keys carry after the class ("poly-mild:you"):
name -> (coefficients, the factor on ||U||_F in the normaliser they are run with). Jiacheng You's quintics (heavyball, dion,
gram-newton-schulz, emerging-optimizers), nanochat's Polar Express for safety 1.02 (dion, dtensor-muon),
Polar Express / 1.05 (gram-newton-schulz), emerging-optimizers' 4-decimal Polar Express. Two schedules of one
class need different coefficients (on the rank-1 fp32 steps of
muon/linear_row-1x16/mb2/noflat/fp32@fp32/ns/none/nesterov/wd0/steps3/lowrank/seed0 our optimizer needs c 0.007
with Keller Jordan's quintic, 0.99 with You's), so each is measured on its own, by our optimizer running those
coefficients (benchmarks/measure_tolerances.py --schedules NAME), never by the peer."""


def schedule_name(spec: Orthogonalizer) -> str:
    """The name of a declared polynomial schedule, by its coefficients: "" for one of OWN_SCHEDULES, its
    SCHEDULES name, or "x" and a digest of the coefficients for any other (never measured). The normaliser is
    not part of it: where it puts the singular values is in the amplification A."""
    declared = tuple(spec.schedule)
    for name, (coefficients, _) in {**OWN_SCHEDULES, **SCHEDULES}.items():
        if declared == tuple(coefficients):
            return "" if name in OWN_SCHEDULES else name
    return "x" + hashlib.sha256(repr(declared).encode()).hexdigest()[:8]


def schedule_of(spec: Orthogonalizer) -> str:
    """The schedule field of a policy key: the class, then ":" and the schedule's name unless it is one of
    OWN_SCHEDULES (an SVD has no schedule)."""
    name = "" if spec.kind in ("svd", "none") else schedule_name(spec)
    return schedule_class(spec) + (f":{name}" if name else "")


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


@dataclass(frozen=True)
class Key:
    optimizer: str
    param_dtype: str
    compute_dtype: str
    schedule: str
    conditioning: str

    def __str__(self) -> str:
        return f"{self.optimizer} {self.param_dtype}@{self.compute_dtype}/{self.schedule}/{self.conditioning}"


@dataclass(frozen=True)
class Measurement:
    """Worst (and median) coefficient c = needed rtol / (u max(1, A)) over n measured cases."""

    worst: float
    median: float
    n: int
    worst_case: str


@dataclass(frozen=True)
class Evidence:
    """A measurement file: where and how it was measured, and its entries by str(Key)."""

    device: str
    meta: dict
    entries: dict[str, Measurement]


@cache
def evidence(device: str) -> Evidence | None:
    """The measurement of device class `device`, or None if there is none."""
    path = MEASURED_DIR / f"tolerance_{device}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    entries = {k: Measurement(**v) for k, v in data.pop("entries").items()}
    return Evidence(device, data, entries)


def coefficient(worst: float) -> float:
    """c of a key from its measured worst: COEFFICIENT_SAFETY x worst rounded up to two significant
    digits, at least COEFFICIENT_FLOOR (so more measured error never gives a tighter c than none)."""
    if COEFFICIENT_SAFETY * worst <= COEFFICIENT_FLOOR:
        return COEFFICIENT_FLOOR
    target = COEFFICIENT_SAFETY * worst
    step = 10.0 ** (math.floor(math.log10(target)) - 1)
    return math.ceil(target / step * (1 - 1e-12)) * step


class NoEntry(LookupError):
    """The policy has no measurement for a key: a gap of the harness, never of the target."""


@dataclass(frozen=True)
class CasePolicy:
    """The tolerances of one case's reference steps: rtol = coefficient * u * max(1, A[i][k])."""

    key: Key
    u: float
    u_format: str
    coefficient: float
    measured: Measurement
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
                f"orthogonalized direction (condition {s.condition:.3g}); c is {COEFFICIENT_SAFETY:g}x the worst "
                f"{self.measured.worst:.3g} measured over {self.measured.n} cases ({self.evidence_note}){closing}")

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


def key_of(case: Case, conv: Conventions, conditioning: str) -> Key:
    return Key(case.optimizer, case.param_dtype, conv.compute_dtype, schedule_of(conv.orthogonalizer),
               conditioning)


def for_case(case: Case, conv: Conventions, grads: Sequence[Sequence[np.ndarray]], device: str) -> CasePolicy:
    """The policy of `case` as a target declaring `conv` runs it on device class `device` (cpu, cuda),
    from the FP64 gradients grads[k][i]. NoEntry names a key the measurements lack."""
    if device not in DEVICE_CLASSES:
        raise ValueError(f"unknown device class {device!r}; expected one of {DEVICE_CLASSES}")
    sens = of_case(case, conv, grads)
    key = key_of(case, conv, conditioning_class(case, sens))
    found, note = evidence(device), f"measured on {device}"
    if found is None:
        found, note = evidence(FALLBACK_DEVICE), f"{FALLBACK_DEVICE} measurement used on {device}"
    if found is None or str(key) not in found.entries:
        named = schedule_name(conv.orthogonalizer) if conv.orthogonalizer.kind == "polynomial" else ""
        how = (f"name its schedule in harness.policy.tolerance.SCHEDULES, then measure it: "
               f"benchmarks/measure_tolerances.py --device {device} --schedules NAME" if named.startswith("x")
               else f"measure it: benchmarks/measure_tolerances.py --device {device}"
               + (f" --schedules {named}" if named else ""))
        raise NoEntry(f"the tolerance policy has no entry for {key} on {device} ({how})")
    measured, with_included = _with_included(found, key)
    u_format = max((case.param_dtype, conv.compute_dtype), key=unit_roundoff)
    floor_format = max((conv.compute_dtype, conv.lr_dtype, opmath(conv.state_dtype)), key=unit_roundoff)
    return CasePolicy(key, unit_roundoff(u_format), u_format, coefficient(measured.worst), measured,
                      f"{note}, {found.meta.get('date', '?')}{with_included}", sens, floor_format)


def _with_included(found: Evidence, key: Key) -> tuple[Measurement, str]:
    """The key's measurement, or, where its algorithm takes every step of another (harness/algorithms.py
    `includes`: Dion2 with fraction 1 is Muon) and that algorithm's same key measured worse, the two
    together (that worst, the cases of both) with a note saying so."""
    own = found.entries[str(key)]
    inner = algorithm(key.optimizer).includes
    other = found.entries.get(str(dataclasses.replace(key, optimizer=inner))) if inner else None
    if other is None or other.worst <= own.worst:
        return own, ""
    both = Measurement(other.worst, own.median, own.n + other.n, other.worst_case)
    return both, f"; with {inner}'s same key, whose steps {key.optimizer} takes at fraction 1"


def for_relation(case: Case, policy: CasePolicy, same_arithmetic: bool) -> Tolerance | str:
    """Tolerance of a relation between two runs of the target on the same inputs of `case`, or why it
    is ill-posed; `same_arithmetic`: both runs apply the same kernels (exact in fp64)."""
    if same_arithmetic and policy.key.compute_dtype == "fp64" and case.param_dtype == "fp64":
        return EXACT
    worst = policy.worst()
    rtol = policy.rtol(worst.amplification)
    if rtol > ILL_POSED_RTOL and not same_arithmetic:
        return f"ill-posed for two runs with different kernels: {policy._source(worst)}"
    capped = min(rtol, ILL_POSED_RTOL)
    note = f" (capped at {ILL_POSED_RTOL:g}: same kernels on the same inputs)" if capped < rtol else ""
    return Tolerance(2.0 * capped, 2.0 * STORAGE_ULPS, f"2 x {policy._source(worst)}{note}")
