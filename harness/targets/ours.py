"""Adapter for this project's `optimizers.Muon` (the default target)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

import optimizers
from cases import Case
from harness.algorithms import algorithm
from harness.running.inputs import TORCH_DTYPES
from harness.targets.base import OptimizerTarget
from oracles import Conventions, Orthogonalizer


class OursMuon(OptimizerTarget):
    """optimizers.Muon (NorMuon through its "normuon" algorithm): sum momentum, Nesterov G + mu M,
    decay before the update with base lr, fans from the matrix view, normaliser ||X|| * s + eps;
    the momentum buffer is held in the parameter's dtype (torch.zeros_like(p))."""

    name = "ours"
    exact_relations = True
    exact_equivalents = True  # NorDion2/Dion2 at fraction 1 run the NorMuon/Muon arithmetic
    tensor_parallel = True
    """It takes tp_mode and num_heads from a TP case (harness/algorithms.py: `options`)."""

    def version(self) -> str:
        return f"optimizers (torch {torch.__version__})"

    def conventions(self, case: Case) -> Conventions:
        return Conventions(
            orthogonalizer=Orthogonalizer.named(case.orthogonalizer, compute_dtype=case.compute_dtype),
            lr_scale=case.adjust_lr, lr_dims="flattened" if case.flatten else "last_two",
            compute_dtype=case.compute_dtype, state_dtype=case.param_dtype)

    def defaults(self, optimizer: str) -> Mapping[str, Any]:
        """Each algorithm's record holds them (harness/algorithms/: `AlgorithmInfo.defaults`)."""
        return algorithm(optimizer).defaults

    def options(self, case: Case) -> dict:
        """Muon keyword arguments for `case` (shared with the negative controls): the algorithm's own, and
        for a matrix algorithm the matrix options; for a defaults case only the algorithm, the lr and the
        compute format (the defaults decide the rest, as `Muon(params, lr=...)` does)."""
        record = algorithm(case)
        if case.construct == "defaults":
            formats = {} if record.elementwise else {"compute_dtype": TORCH_DTYPES[case.compute_dtype]}
            return dict(algorithm=case.optimizer, lr=case.lr, **formats)
        chosen = dict(algorithm=case.optimizer, lr=case.lr, weight_decay=case.weight_decay, **record.options(case))
        if record.elementwise:
            return chosen
        return dict(chosen, momentum=case.momentum, nesterov=case.nesterov, flatten=case.flatten,
                    adjust_lr=None if case.adjust_lr == "none" else case.adjust_lr,
                    orthogonalizer=case.orthogonalizer, compute_dtype=TORCH_DTYPES[case.compute_dtype])

    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        return self.make_distributed(params, case, None)

    def make_distributed(self, params: list[torch.nn.Parameter], case: Case, mesh: Any) -> torch.optim.Optimizer:
        """optimizers.Muon over `params` laid out on `mesh` (None: one process), the same protocol
        method every third-party adapter with a distributed path has."""
        return optimizers.Muon(params, **self.options(case), mesh=mesh)


def target() -> OursMuon:
    return OursMuon()
