"""The one key scheme of every measured table: what a measurement is of, as one string.

  optimizer/param@compute/schedule/regime[/layer/view]

  optimizer  the algorithm (`Case.optimizer`) whose steps were measured
  param@compute  the parameter dtype and the compute dtype the target declares
  schedule   the orthogonalizer the target runs: for a coefficient, its class (schedule_class) and
             the schedule's name (schedule_of: "poly-steep", "poly-mild:you", "svd"); for the bf16
             noise of a statistic, the case's orthogonalizer and the declared schedule where it is
             not ours (noise_schedule: "polar_express", "newton_schulz:you")
  regime     the inputs: the conditioning class of the orthogonalized directions (coefficients:
             "well", "ill", "rank-1") or the gradient kind, with the declared eps where it sets
             the noise (noise: "gaussian", "tiny:eps1e-08")
  layer/view the layer and its matrix view ("flat", "noflat"): only where the statistic depends on
             the matrix shape (drift; the noise of a matrix with one singular value)

No field holds "/"; `Key.parse(str(key)) == key`.
"""

from __future__ import annotations

import hashlib
import types
from collections.abc import Mapping
from dataclasses import dataclass

from cases import Case
from cases.data import matrix_shape
from oracles import Conventions, Orthogonalizer
from oracles.coefficients import (GNS_SAFETY, POLAR_EXPRESS_4DP, POLAR_EXPRESS_RAW, POLAR_EXPRESS_SAFETY,
                                  POLAR_EXPRESS_SAFETY_102, YOU_QUINTICS, Coefficients, newton_schulz_schedule,
                                  polar_express_schedule, safety_scaled)

VIEWS = ("flat", "noflat")


@dataclass(frozen=True)
class Key:
    optimizer: str
    param_dtype: str
    compute_dtype: str
    schedule: str
    regime: str
    layer: str = ""
    view: str = ""

    def __post_init__(self) -> None:
        for name in ("optimizer", "param_dtype", "compute_dtype", "schedule", "regime", "layer", "view"):
            value = getattr(self, name)
            if "/" in value or (name in ("param_dtype", "compute_dtype") and "@" in value):
                raise ValueError(f"Key.{name}={value!r} holds a separator ('/' or '@')")
        if not all((self.optimizer, self.param_dtype, self.compute_dtype, self.schedule, self.regime)):
            raise ValueError(f"Key {self.__dict__}: optimizer, dtypes, schedule and regime are required")
        if bool(self.layer) != bool(self.view) or (self.view and self.view not in VIEWS):
            raise ValueError(f"Key layer {self.layer!r} / view {self.view!r}: both or neither, view one of {VIEWS}")

    def __str__(self) -> str:
        shape = f"/{self.layer}/{self.view}" if self.layer else ""
        return f"{self.optimizer}/{self.param_dtype}@{self.compute_dtype}/{self.schedule}/{self.regime}{shape}"

    @classmethod
    def parse(cls, text: str) -> "Key":
        """The key whose string form is `text`; ValueError says which part is malformed."""
        parts = text.split("/")
        if len(parts) not in (4, 6):
            raise ValueError(f"policy key {text!r}: expected optimizer/param@compute/schedule/regime[/layer/view], "
                             f"got {len(parts)} fields")
        dtypes = parts[1].split("@")
        if len(dtypes) != 2:
            raise ValueError(f"policy key {text!r}: expected param@compute as its second field, got {parts[1]!r}")
        return cls(parts[0], dtypes[0], dtypes[1], parts[2], parts[3], *parts[4:])

# --- schedules -------------------------------------------------------------------------------------

STEEP_COEFFICIENT = 8.0
"""Schedule class "poly-steep": some step has a coefficient above this in magnitude (Polar Express's
first step: 8.2, -23.6, 17.3), so near s = 1 terms of that size cancel to O(1) and rounding is
amplified beyond what Keller Jordan's quintic (3.4445, -4.775, 2.0315, class "poly-mild") sees."""

OWN_SCHEDULES: Mapping[str, tuple[tuple[Coefficients, ...], float]] = types.MappingProxyType({
    "newton_schulz": (tuple(newton_schulz_schedule(5)), 1.0),
    "polar_express": (tuple(polar_express_schedule(5)), POLAR_EXPRESS_SAFETY),
})
"""The schedules optimizers.Muon runs, by their option names -> (coefficients, normaliser scale): Keller
Jordan's quintic, and Polar Express with its 1.01 safety (either under the Gram iteration too). Their
keys carry the schedule class alone."""

SCHEDULES: Mapping[str, tuple[tuple[Coefficients, ...], float]] = types.MappingProxyType({
    "you": (YOU_QUINTICS, 1.0),
    "pe102": (POLAR_EXPRESS_SAFETY_102, 1.02),
    "pe105": (safety_scaled(POLAR_EXPRESS_RAW[:5], GNS_SAFETY), 1.0),
    "pe4dp": (POLAR_EXPRESS_4DP, 1.0),
})
"""Every other schedule a built-in adapter declares, by the name its keys carry after the class ("poly-mild:you"):
name -> (coefficients, the factor on ||U||_F in the normaliser they are run with). Jiacheng You's quintics (heavyball,
dion, gram-newton-schulz, emerging-optimizers), nanochat's Polar Express for safety 1.02 (dion, dtensor-muon),
Polar Express / 1.05 (gram-newton-schulz), emerging-optimizers' 4-decimal Polar Express. Two schedules of one
class need different coefficients (a rank-1 fp32 step needs c 0.007 with Keller Jordan's quintic, 0.99 with
You's), so each is measured on its own, by a correct implementation running those coefficients
(harness/policy/calibrate), never by the peer."""


def schedule_class(spec: Orthogonalizer) -> str:
    """"svd", "poly-steep" or "poly-mild" for a declared orthogonalizer, from its own coefficients;
    "gram-" before a polynomial evaluated by the Gram iteration (its rounding is amplified more);
    "elementwise" where nothing is orthogonalized (kind "none")."""
    if spec.kind in ("svd", "none"):
        return "svd" if spec.kind == "svd" else "elementwise"
    peak = max((abs(c) for step in spec.schedule for c in step), default=0.0)
    return ("gram-" if spec.iteration == "gram" else "") + ("poly-steep" if peak > STEEP_COEFFICIENT else "poly-mild")


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
    """The schedule field of a coefficient key: the class, then ":" and the schedule's name unless it is one
    of OWN_SCHEDULES (an SVD has no schedule)."""
    name = "" if spec.kind in ("svd", "none") else schedule_name(spec)
    return schedule_class(spec) + (f":{name}" if name else "")


def noise_schedule(case: Case, declared: Orthogonalizer | None) -> str:
    """The schedule field of a noise key: the case's orthogonalizer, then, where the target runs other
    coefficients (or another iteration) than ours runs for it, ":" and the schedule's name (schedule_name;
    ours' option name for one of ours run on another orthogonalizer's cases, e.g. Keller Jordan's quintic in
    the Gram iteration), after the declared iteration where it is not the case's ("gram-")."""
    if declared is None or declared.kind != "polynomial":
        return case.orthogonalizer
    own = Orthogonalizer.named(case.orthogonalizer)
    if tuple(declared.schedule) == tuple(own.schedule) and declared.iteration == own.iteration:
        return case.orthogonalizer
    name = schedule_name(declared) or next(
        n for n, (coefficients, _) in OWN_SCHEDULES.items() if tuple(coefficients) == tuple(declared.schedule))
    iteration = "" if declared.iteration == own.iteration else f"{declared.iteration}-"
    return f"{case.orthogonalizer}:{iteration}{name}"


# --- the keys of each kind of measurement ------------------------------------------------------------

EPS_GRADIENTS = ("tiny",)
"""Gradient kinds whose bf16 noise depends on the declared normaliser's eps: at 1e-10 gradients eps dominates
s ||U|| + eps, so it sets where the polynomial starts (a 1 x 16 tiny direction: sigma 0.04 under eps 1e-8,
0.004 under ours' 1e-7) and how much it amplifies the bf16 rounding. Elsewhere eps is ~1e-8 of ||U||."""


def coefficient_key(case: Case, conv: Conventions, conditioning: str) -> Key:
    """The key of the rounding coefficient of `case` run as `conv` declares, its directions of `conditioning`."""
    return Key(case.optimizer, case.param_dtype, conv.compute_dtype, schedule_of(conv.orthogonalizer), conditioning)


def noise_key(case: Case, compute_dtype: str, optimizer: str | None = None,
              declared: Orthogonalizer | None = None) -> Key:
    """The bf16 noise key of `case` run in `compute_dtype` (as `optimizer`, default the case's own) by a target
    declaring orthogonalizer `declared` (default ours'): the noise is that of the schedule the target runs
    (You's quintics on a rank-1 bf16 step move the norm statistic ~3x as far as Keller Jordan's), for
    EPS_GRADIENTS of the declared eps where it is not ours' ("tiny:eps1e-08"), and for a matrix with one singular
    value of its layer and view (`one_singular_value`)."""
    regime = case.grad
    if declared is not None and declared.kind == "polynomial" and case.grad in EPS_GRADIENTS:
        eps = declared.normaliser.eps
        regime += "" if eps == Orthogonalizer.named(case.orthogonalizer).normaliser.eps else f":eps{eps:g}"
    key = Key(optimizer or case.optimizer, case.param_dtype, compute_dtype, noise_schedule(case, declared), regime)
    return _with_shape(key, case) if one_singular_value(case) else key


def one_singular_value(case: Case) -> bool:
    """Whether `case`'s parameter has one singular value in all (a 1 x n layer; a 1 x 1 convolution's 32 kernel
    taps are 32). Its bf16 noise is keyed by layer and view: each statistic is then one vector's rounding, not an
    average over singular directions, and its tail is far from what a few draws show (ours' Dion2 on linear_row,
    Polar Express in bf16, tiny gradients: |decay| of
    20000 seeds has median 6.9e-4, 99.9th percentile 5.1e-3 and maximum 6.9e-3; the key shared with every
    layer, measured at seed 0, allowed 5.1e-3, and 17 of the 20000 correct runs failed)."""
    b, m, n = matrix_shape(case.shape, case.flatten)
    return b * min(m, n) == 1


def _with_shape(key: Key, case: Case) -> Key:
    """`key` with the case's layer and matrix view ("flat" only where flattening changes it: a 2-D layer's one
    matrix is the same either way)."""
    return Key(key.optimizer, key.param_dtype, key.compute_dtype, key.schedule, key.regime, case.layer,
               "flat" if case.flatten and len(case.shape) > 2 else "noflat")


def drift_key(case: Case, compute_dtype: str) -> Key:
    """The drift key: the noise key of ours' schedule with the layer and its matrix view (the noise of a correct
    run depends on the matrix shape: maxima over every shape would be the 1 x n layer's)."""
    return _with_shape(noise_key(case, compute_dtype), case)
