"""The registry of algorithm records: a group's `algorithm` option names one of these, or is a
record itself (a variant: `dataclasses.replace(MUON, orthogonalize=...)`). Adding an algorithm is
one module defining its record and one entry here."""

from __future__ import annotations

import types
from typing import Any, Mapping

from optimizers.algorithms.adamw import ADAMW
from optimizers.algorithms.base import Algorithm, StateKey
from optimizers.algorithms.dion2 import DION2, NORDION2
from optimizers.algorithms.muon import MUON
from optimizers.algorithms.normuon import NORMUON

REGISTRY: Mapping[str, Algorithm] = types.MappingProxyType({a.name: a for a in (MUON, NORMUON, DION2, NORDION2, ADAMW)})


def resolve(where: str, algorithm: Any) -> Algorithm:
    """The record of a group's `algorithm` option: a record as it is, a registered name looked up."""
    if isinstance(algorithm, Algorithm):
        return algorithm
    if isinstance(algorithm, str) and algorithm in REGISTRY:
        return REGISTRY[algorithm]
    raise ValueError(f"{where}: unknown algorithm {algorithm!r}; expected an Algorithm record or one of "
                     f"{tuple(REGISTRY)}")


__all__ = ["ADAMW", "Algorithm", "DION2", "MUON", "NORDION2", "NORMUON", "REGISTRY", "StateKey", "resolve"]
