"""Muon's cases: the shared covering arrays, and the only algorithm with tensor-parallel layouts."""

from cases.algorithms import AlgorithmCases

ENTRY = AlgorithmCases("muon", covered=True, tensor_parallel=True)
