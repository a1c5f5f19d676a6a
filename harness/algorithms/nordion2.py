"""NorDion2: Dion2 selecting whole rows, each selected row normalised by its second-moment EMA and the
update's norm restored (oracles/dion2_reference.py). Under Shard(0) each rank also restores the norm of
its own rows, as NorMuon does."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import numpy as np

from cases import Case
from cases.layouts import shard_dim
from harness.algorithms import AlgorithmInfo, Oracle
from harness.algorithms.dion2 import DEFAULTS, fraction_one, options, selected_directions, selection_blocks
from harness.algorithms.muon import row_blocks
from harness.policy.ill_posed import selection_ill_posed
from oracles import Conventions, NorDion2Hyper, initial_row_variance, reference_nordion2_step


def _oracle(case: Case, conv: Conventions) -> Oracle:
    hyper = NorDion2Hyper(case.lr, case.fraction, case.ef_decay, case.weight_decay, case.flatten,
                          beta2=case.beta2)
    blocks, restore = selection_blocks(case, rows_only=True), row_blocks(case)

    def step(x: np.ndarray, state: Any, g: np.ndarray) -> tuple[np.ndarray, Any, float]:
        x, m, v, margin = reference_nordion2_step(x, *state, g, hyper, conv, blocks, restore)
        return x, (m, v), margin
    return Oracle((np.zeros(case.shape), initial_row_variance(case.shape, case.flatten)), step)


def _invariant(case: Case) -> bool:
    """Layout invariant where the selection scopes coincide and no rank restores its own rows' norm."""
    return selection_blocks(case, rows_only=True) is None and shard_dim(case.layout) != 0


INFO = AlgorithmInfo("nordion2", _oracle, selected_directions(True), selection_ill_posed, selects=True, rows_only=True,
                     local_blocks=lambda case: selection_blocks(case, rows_only=True),
                     equivalent=fraction_one("normuon"), layout_invariant=_invariant,
                     options=lambda case: {**options(case), "beta2": case.beta2},
                     defaults=MappingProxyType({**DEFAULTS, "beta2": 0.95}), includes="normuon")
