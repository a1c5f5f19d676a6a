"""NorMuon: Muon's direction orthogonalized, then each output row normalised by its second-moment EMA and
the update's norm restored (oracles/normuon_reference.py); under Shard(0) each rank restores the norm of
its own rows, so its distributed step depends on the layout."""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

import numpy as np

from cases import Case
from cases.layouts import shard_dim
from harness.algorithms import AlgorithmInfo, Oracle
from harness.algorithms.muon import DEFAULTS, momentum_directions, row_blocks
from oracles import Conventions, NorMuonHyper, initial_variance, reference_normuon_step


def _oracle(case: Case, conv: Conventions) -> Oracle:
    hyper = NorMuonHyper(case.lr, case.momentum, case.nesterov, case.weight_decay, case.flatten, beta2=case.beta2)
    blocks = row_blocks(case)

    def step(x: np.ndarray, state: Any, g: np.ndarray) -> tuple[np.ndarray, Any, float]:
        x, m, v = reference_normuon_step(x, *state, g, hyper, conv, blocks)
        return x, (m, v), math.inf
    return Oracle((np.zeros(case.shape), initial_variance(case.shape, case.flatten, conv.normuon_rows)), step)


INFO = AlgorithmInfo("normuon", _oracle, momentum_directions,
                     layout_invariant=lambda case: shard_dim(case.layout) is None,
                     options=lambda case: {"beta2": case.beta2}, defaults=MappingProxyType({**DEFAULTS, "beta2": 0.95}),
                     robust_checks=("rows",), drift=True)
