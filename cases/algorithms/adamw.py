"""AdamW's cases: the elementwise fallback (1-D parameters, embeddings, or any weight a user keeps out of
Muon), its momentum being beta1; every layer of the tier and the vector layers (cases/space.py)."""

from cases.algorithms import AlgorithmCases

ENTRY = AlgorithmCases("adamw", ("momentum", "beta2"), elementwise=True, layouts=("replicated", "shard0", "shard1"))
