"""The case side of each algorithm a case can name (`Case.optimizer`), one module each: which case axes it
takes, which layouts, and the cases it adds to the tiers beyond the shared covering arrays.

A module defines `ENTRY`, an `AlgorithmCases`; `registry()` discovers them. Order: the algorithms the shared
covering arrays vary (`covered`) first, then the others, each part by name.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

from cases.layouts import DISTRIBUTED

Generator = Callable[[], Iterable[Any]]
"""A function returning cases (`Case`)."""


@dataclass(frozen=True)
class AlgorithmCases:
    """name: `Case.optimizer`; covered: the shared covering arrays of cases/tiers.py vary it; selecting: its
    cases carry a fraction (and, when distributed, a selection scope) and have no Nesterov form; layouts: the
    distributed layouts its cases may have; tensor_parallel: its cases may have tensor-parallel layouts;
    hyper: the hyper-parameters of `Case` it has beyond lr and weight decay (momentum, beta2, ef_decay: the
    others stay at their defaults); elementwise: it has no matrix stages (AdamW: no orthogonalizer, any
    parameter rank, computed in the parameter's dtype); generators: tier name -> the functions returning the cases it adds to
    that tier."""

    name: str
    hyper: tuple[str, ...] = ("momentum",)
    covered: bool = False
    selecting: bool = False
    elementwise: bool = False
    layouts: tuple[str, ...] = DISTRIBUTED
    tensor_parallel: bool = False
    generators: Mapping[str, tuple[Generator, ...]] = field(default_factory=lambda: MappingProxyType({}))


@functools.cache
def registry() -> tuple[AlgorithmCases, ...]:
    """Every entry, covered ones first, then by name."""
    found = [importlib.import_module(f"{__name__}.{m.name}").ENTRY for m in pkgutil.iter_modules(__path__)]
    return tuple(sorted(found, key=lambda e: (not e.covered, e.name)))


def names() -> tuple[str, ...]:
    """Every algorithm a case may name."""
    return tuple(e.name for e in registry())


def entry(name: str) -> AlgorithmCases:
    """The entry of algorithm `name`; ValueError names the known ones."""
    for e in registry():
        if e.name == name:
            return e
    raise ValueError(f"Case.optimizer={name!r}; expected one of {names()}")


def covered() -> tuple[str, ...]:
    """The algorithms the shared covering arrays vary."""
    return tuple(e.name for e in registry() if e.covered)


def selecting() -> tuple[str, ...]:
    """The algorithms that orthogonalize a selected fraction of slices."""
    return tuple(e.name for e in registry() if e.selecting)
