"""Negative controls of tensor-parallel Muon: our Muon with one TP option overridden, so that it
does something other than the case (and so its declared semantics) says. The TP checks must flag
each (tests/test_tp_cases.py).

  per-shard-as-gather   orthogonalizes each TP shard alone while the case says gather (what
                        DeepSpeed's Muon under AutoTP does, declared as the unsharded update)
  gather-as-per-shard   orthogonalizes the whole matrix while the case says per_shard
  heads-ignored         orthogonalizes the whole matrix while the case says num_heads

Use as a target spec, e.g. `--target harness.targets.tp_controls:per_shard_as_gather`.
"""

from __future__ import annotations

from typing import Any

from cases import Case
from harness.targets.ours import OursMuon


class TPControl(OursMuon):
    """Our adapter (same declared conventions) with the TP options `override` replaces."""

    def __init__(self, name: str, override: dict[str, Any]) -> None:
        self.name = name
        self.override = override

    def options(self, case: Case) -> dict[str, Any]:
        options = super().options(case)
        return {**options, **self.override} if case.tensor_parallel is not None else options


def per_shard_as_gather() -> TPControl:
    return TPControl("control-tp-per-shard-as-gather", {"tp_mode": "per_shard"})


def gather_as_per_shard() -> TPControl:
    return TPControl("control-tp-gather-as-per-shard", {"tp_mode": "gather"})


def heads_ignored() -> TPControl:
    return TPControl("control-tp-heads-ignored", {"num_heads": None})
