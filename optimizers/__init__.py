"""Production Muon-family optimizers: megabatched, convolution-correct, one record per algorithm."""

from optimizers.algorithms import REGISTRY, Algorithm, StateKey
from optimizers.algorithms.adamw import ADAMW
from optimizers.algorithms.dion2 import DION2, NORDION2, Dion2, NorDion2
from optimizers.algorithms.muon import MUON
from optimizers.algorithms.normuon import NORMUON, NorMuon
from optimizers.muon import Muon

__all__ = ["ADAMW", "Algorithm", "DION2", "Dion2", "MUON", "Muon", "NORDION2", "NORMUON", "NorDion2", "NorMuon",
           "REGISTRY", "StateKey"]
