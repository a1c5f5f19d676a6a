"""`Dion2` and `NorDion2`: `Muon` whose groups default to the "dion2" / "nordion2" algorithm
records (optimizers/algorithms/dion2.py), with Dion2's defaults (lr 0.01)."""

from __future__ import annotations

from typing import Any, Iterable

from optimizers.algorithms.dion2 import DION2
from optimizers.muon import Muon


class Dion2(Muon):
    """Dion2: Muon on the top `fraction` of each matrix's slices by L1 norm, error feedback
    `ef_decay` on the selected slices (optimizers/algorithms/dion2.py for the update).

    Args (beyond Muon's orthogonalizer, ns_steps, compute_dtype, eps, mesh, flatten, adjust_lr):
      fraction: share of slices orthogonalized each step, in (0, 1].
      ef_decay: error-feedback decay of the selected slices of the momentum, in [0, 1].
      selection_scope: "local" (each rank selects among the slices it holds) or "global"
        (top-k of the whole matrix: the step does not depend on the layout).
    Raises ValueError/TypeError at construction on bad options (nesterov=True included)."""

    def __init__(self, params: Iterable[Any], lr: float = 0.01, fraction: float = DION2.defaults["fraction"],
                 ef_decay: float = DION2.defaults["ef_decay"],
                 selection_scope: str = DION2.defaults["selection_scope"], **options: Any) -> None:
        super().__init__(params, **{"algorithm": "dion2", "lr": lr, "fraction": fraction, "ef_decay": ef_decay,
                                    "selection_scope": selection_scope, **options})


class NorDion2(Dion2):
    """NorDion2: Dion2 selecting rows (output channels) always, whose selected rows are normalised
    as NorMuon's (beta2, variance_eps; a second moment per row, updated where selected)."""

    def __init__(self, params: Iterable[Any], **options: Any) -> None:
        super().__init__(params, **{"algorithm": "nordion2", **options})
