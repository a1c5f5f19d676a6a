"""Production Muon-family optimizers: megabatched, convolution-correct, one record per algorithm."""

from optimizers.algorithms import ADAMW, MUON, NORMUON, REGISTRY, Algorithm, StateKey
from optimizers.muon import Muon, NorMuon

__all__ = ["ADAMW", "Algorithm", "MUON", "Muon", "NORMUON", "NorMuon", "REGISTRY", "StateKey"]
