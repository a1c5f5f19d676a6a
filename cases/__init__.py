"""The case generator: Muon test cases as data, with stable ids and two tiers."""

from cases.case import Case
from cases.data import gradient, initial_parameter, matrix_shape
from cases.tiers import TIERS, ci_cases, nightly_cases, tier

__all__ = ["Case", "gradient", "initial_parameter", "matrix_shape", "TIERS", "ci_cases", "nightly_cases", "tier"]
