"""AdamW, the elementwise fallback for 1-D parameters and embeddings: its FP64 reference with bias
correction (oracles/adamw_reference.py); `momentum` is its beta1. Nothing is orthogonalized, so its
direction contract yields no matrix and the tolerance policy's amplification is 1."""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

import numpy as np

from cases import Case
from harness.algorithms import AlgorithmInfo, Directions, Oracle
from oracles import Conventions
from oracles.adamw_reference import AdamWHyper, initial_moments, reference_adamw_step


def _oracle(case: Case, conv: Conventions) -> Oracle:
    hyper = AdamWHyper(case.lr, case.momentum, case.beta2, case.weight_decay)

    def step(x: np.ndarray, state: Any, g: np.ndarray) -> tuple[np.ndarray, Any, float]:
        return (*reference_adamw_step(x, state, g, hyper, conv), math.inf)
    return Oracle(initial_moments(case.shape), step)


def _directions(case: Case, conv: Conventions) -> Directions:
    """No matrix is orthogonalized: every step yields none."""
    return Directions(None, lambda state, g: (state, []))


INFO = AlgorithmInfo("adamw", _oracle, _directions,
                     options=lambda case: {"betas": (case.momentum, case.beta2)},
                     defaults=MappingProxyType(dict(momentum=0.9, beta2=0.95, weight_decay=0.0)))
