"""Production Muon-family optimizers: megabatched, convolution-correct, one record per algorithm."""

from optimizers.algorithms import ADAMW, DION2, MUON, NORDION2, NORMUON, REGISTRY, Algorithm, StateKey
from optimizers.dion2 import Dion2, NorDion2
from optimizers.muon import Muon, NorMuon

__all__ = ["ADAMW", "Algorithm", "DION2", "Dion2", "MUON", "Muon", "NORDION2", "NORMUON", "NorDion2", "NorMuon",
           "REGISTRY", "StateKey"]
