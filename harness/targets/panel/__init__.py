"""The calibration panel: independent correct implementations of the algorithms the harness judges, each a
target declaring its conventions as they are (harness/policy/calibrate/ measures the statistical allowances
over them and ours, so that a correct implementation that rounds differently from ours is not failed).

A `Member` is a target spec and where the implementation is known not to be correct (its findings: no
allowance is measured there, and no false alarm counted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from cases import Case
from cases.axes import EXTREME_GRADIENT, NONFINITE_GRADIENT
from harness.targets.panel.plain import Plain
from harness.targets.torch_builtin import findings


@dataclass(frozen=True)
class Member:
    spec: str
    known: Callable[[Case], str | None] = lambda case: None


def textbook() -> Plain:
    """Keller Jordan's loop (A = X X^T, B = b A + c A^2, X = a X + B X), momentum in the parameter's dtype."""
    return Plain("fused", "param")


def textbook_fp32_momentum() -> Plain:
    """The same loop with the momentum buffer in fp32 for bf16 parameters."""
    return Plain("fused", "fp32")


def expanded() -> Plain:
    """Keller Jordan's iteration as the formula reads, X = a X + b (X X^T) X + c (X X^T)^2 X, momentum in the
    parameter's dtype."""
    return Plain("expanded", "param")


def expanded_fp32_momentum() -> Plain:
    return Plain("expanded", "fp32")


def outside_range(case: Case) -> str | None:
    """Where a plain member is not meant to be correct: gradients near the format's range (its normaliser
    ||X||_F, formed as written, overflows) or not finite (it follows no policy for them)."""
    if case.grad in (EXTREME_GRADIENT, NONFINITE_GRADIENT):
        return (f"{case.grad} gradients: the textbook loop's normaliser overflows near the format's range and it "
                f"has no policy for non-finite gradients")
    return None


PANEL: tuple[Member, ...] = (
    Member("harness.targets.panel:textbook", outside_range),
    Member("harness.targets.panel:textbook_fp32_momentum", outside_range),
    Member("harness.targets.panel:expanded", outside_range),
    Member("harness.targets.panel:expanded_fp32_momentum", outside_range),
    Member("torch", findings),
)
"""The independent members (ours joins them in every calibration: harness/policy/calibrate/panel.py)."""
