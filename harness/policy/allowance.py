"""The one safety-factor rule: a measured worst becomes an allowance as its table's kind says.

  allowance = max(floor, round_up(factor x worst, digits))

round_up to `digits` significant digits (None: no rounding). The factor covers what the measurement
did not draw: a correct run on another case, seed or implementation sits further out than the worst
measured. The floor keeps a key with little measured error (too few cases to go lower) from an
allowance tighter than no measurement would give.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Safety:
    factor: float
    digits: int | None
    floor: float


SAFETY: Mapping[str, Safety] = types.MappingProxyType({
    "coefficient": Safety(2.0, 2, 0.05),
    "noise": Safety(3.0, None, 0.0),
    "drift": Safety(3.0, None, 0.0),
})
"""Per table kind (harness/policy/tables.py). coefficient: c = 2x the worst, rounded up to two significant
digits, at least 0.05; no more than 2x, since in bf16 the first-order amplification already overestimates
the error ~15x (a Gaussian Polar Express case, A ~ 300, sits at rtol ~0.17 at 2x, below ILL_POSED_RTOL);
the floor is 2x the lower end (0.02-0.03) of the measured nonzero worsts (a property-test step needed 0.032
in a key whose 11 cases had reached 0.0085). noise and drift: 3x the worst |statistic| of the panel, a
signed mean over steps and members whose rounding has no preferred sign."""


def allowance(kind: str, worst: float) -> float:
    """The allowance of a table of `kind` for a measured `worst` (>= 0); ValueError for an unknown kind or a
    negative or non-finite worst."""
    if kind not in SAFETY:
        raise ValueError(f"no safety rule for table kind {kind!r}; expected one of {tuple(SAFETY)}")
    if not (math.isfinite(worst) and worst >= 0.0):
        raise ValueError(f"a measured worst must be finite and >= 0, got {worst!r}")
    rule = SAFETY[kind]
    target = rule.factor * worst
    if target <= rule.floor:
        return rule.floor
    if rule.digits is None:
        return target
    step = 10.0 ** (math.floor(math.log10(target)) - rule.digits + 1)
    return math.ceil(target / step * (1 - 1e-12)) * step


def describe(kind: str) -> str:
    """The rule of `kind` in words, for a tolerance's source."""
    rule = SAFETY[kind]
    rounded = f" rounded up to {rule.digits} significant digits" if rule.digits else ""
    floor = f", at least {rule.floor:g}" if rule.floor else ""
    return f"{rule.factor:g}x the worst{rounded}{floor}"
