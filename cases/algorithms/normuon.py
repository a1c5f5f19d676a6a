"""NorMuon's cases: the shared covering arrays; distributed only replicated or row-sharded (its row
statistics need whole rows)."""

from cases.algorithms import AlgorithmCases

ENTRY = AlgorithmCases("normuon", ("momentum", "beta2"), covered=True, layouts=("replicated", "shard0"))
