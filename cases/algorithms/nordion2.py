"""NorDion2's cases: a selecting algorithm (Dion2's generators make its cases, cases/algorithms/dion2.py);
distributed only replicated or row-sharded (its row statistics need whole rows)."""

from cases.algorithms import AlgorithmCases

ENTRY = AlgorithmCases("nordion2", ("ef_decay", "beta2"), selecting=True, layouts=("replicated", "shard0"))
