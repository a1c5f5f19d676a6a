"""Independent FP64 references for Muon-family optimizers.

NumPy and SciPy (LAPACK) only: no torch kernel and no import of `optimizers`, so
an oracle shares no code path with what it judges.
"""

from oracles.coefficients import KELLER_JORDAN_QUINTIC, POLAR_EXPRESS_RAW, newton_schulz_schedule, polar_express_schedule
from oracles.conventions import Conventions, Orthogonalizer, lr_scale
from oracles.dion2_reference import (Dion2Hyper, NorDion2Hyper, initial_row_variance, reference_dion2_step,
                                     reference_nordion2_step, select)
from oracles.muon_reference import MuonHyper, matrix_view, orthogonalize, reference_muon_step
from oracles.normuon_reference import NorMuonHyper, initial_variance, reference_normuon_step
from oracles.rounding import round_to, ulp
from oracles.spectral import Normaliser, compose, polar_factor, singular_values, spectral_map

__all__ = [
    "KELLER_JORDAN_QUINTIC", "POLAR_EXPRESS_RAW", "newton_schulz_schedule", "polar_express_schedule",
    "Conventions", "Orthogonalizer", "lr_scale", "MuonHyper", "matrix_view", "orthogonalize",
    "reference_muon_step", "NorMuonHyper", "initial_variance", "reference_normuon_step", "round_to", "ulp",
    "Normaliser", "compose", "polar_factor", "singular_values", "spectral_map",
    "Dion2Hyper", "NorDion2Hyper", "initial_row_variance", "reference_dion2_step", "reference_nordion2_step", "select",
]
