"""Production Muon-family optimizers: megabatched, convolution-correct."""

from optimizers.muon import Muon

__all__ = ["Muon"]
