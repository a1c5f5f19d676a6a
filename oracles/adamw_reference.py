"""FP64 reference AdamW (Loshchilov & Hutter, 2019, with Adam's bias correction; Kingma & Ba, 2015): the
elementwise fallback Muon-family optimizers use for 1-D parameters and embeddings. At step t (from 1):

  m <- b1 m + (1 - b1) G;   v <- b2 v + (1 - b2) G^2              held in `conv.state_dtype`
  X <- X (1 - lr wd)                                             decoupled decay, before the update
  X <- X - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)     eps from `conv.adam_eps`

The moments are rounded to the declared state format after every update, as a target that holds them in
its parameter's dtype stores them; the rest is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oracles.conventions import Conventions
from oracles.rounding import round_to


@dataclass(frozen=True)
class AdamWHyper:
    lr: float
    beta1: float
    beta2: float
    weight_decay: float


AdamWState = tuple[np.ndarray, np.ndarray, int]
"""(m, v, steps taken)."""


def initial_moments(shape: tuple[int, ...]) -> AdamWState:
    return np.zeros(shape), np.zeros(shape), 0


def reference_adamw_step(x: np.ndarray, state: AdamWState, g: np.ndarray, hyper: AdamWHyper,
                         conv: Conventions) -> tuple[np.ndarray, AdamWState]:
    """One FP64 AdamW step of one parameter: (new parameter, new state)."""
    m, v, t = state
    g = np.asarray(g, np.float64)
    t += 1
    m = round_to(hyper.beta1 * m + (1.0 - hyper.beta1) * g, conv.state_dtype)
    v = round_to(hyper.beta2 * v + (1.0 - hyper.beta2) * g * g, conv.state_dtype)
    step = (m / (1.0 - hyper.beta1**t)) / (np.sqrt(v / (1.0 - hyper.beta2**t)) + conv.adam_eps)
    x = np.asarray(x, np.float64) * (1.0 - hyper.lr * hyper.weight_decay)
    return x - hyper.lr * step, (m, v, t)
