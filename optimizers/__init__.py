"""Production Muon-family optimizers: megabatched, convolution-correct."""

from optimizers.muon import Muon, NorMuon

__all__ = ["Muon", "NorMuon"]
