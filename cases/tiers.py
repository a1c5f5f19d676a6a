"""The CI and nightly tiers: deterministic lists of cases, generated as covering arrays.

A tier is the union of its generators' cases. Each generator here is a `Space` of case axes
(cases/covering.py) with the constraints of valid cases, in which every triple of values of
every three axes appears in some case. That holds in particular for the axes that interact:

  single-process  layer kind x flatten x gradient kind x algorithm x compute dtype (a NorMuon
                  flattened conv with Gaussian gradients is such a triple), layer x megabatch
                  x flatten (members of a megabatch must not mix)
  distributed     layer x layout x world size (even, uneven and empty shards), megabatch x
                  layout x world size (how members spread over owners), algorithm x layout

CI uses the small layers, world sizes 2-4 and one seed; nightly the larger layers too, world
sizes up to 8 and more seeds, and contains the CI tier. Another generator (say, for a new
algorithm) is one more entry of `GENERATORS`: a space's `cases_of`, or any function
returning cases.
"""

from __future__ import annotations

import functools
import itertools
from typing import Callable, Iterable

from cases import axes, layouts
from cases.case import Case
from cases.covering import Constraint, Space, covering_array

TIERS = ("ci", "nightly")

DERIVED = ("kind",)
"""Axes of a space that are no field of Case: the layer kind follows from the layer."""

CONSTRAINTS = (
    Constraint(("layer", "kind"), lambda layer, kind: axes.all_layers()[layer][0] == kind,
               "a layer has one kind"),
    Constraint(("layer", "flatten"), lambda layer, flatten: not flatten or len(axes.all_layers()[layer][1]) > 2,
               "flatten only for 3-D+ layers"),
    Constraint(("kind", "flatten"), lambda kind, flatten: not flatten or kind != "linear",
               "flatten only for 3-D+ layers"),
    Constraint(("param_dtype", "compute_dtype"), lambda p, c: (p, c) in axes.DTYPE_PAIRS,
               "(parameter, compute) dtype pairs of axes.DTYPE_PAIRS"),
    Constraint(("orthogonalizer", "compute_dtype"), axes.compute_ok, "svd never computes in bf16"),
    Constraint(("optimizer", "layout"), lambda opt, layout: opt != "normuon" or layout != "shard1",
               "NorMuon is replicated or row-sharded (its rows must stay whole)"),
)

def _common(layers: Iterable[str], seeds: Iterable[int]) -> dict[str, tuple]:
    layers = tuple(layers)
    return {
        "layer": layers, "kind": tuple(dict.fromkeys(axes.all_layers()[n][0] for n in layers)),
        "megabatch": axes.MEGABATCH_SIZES, "flatten": (False, True), "param_dtype": axes.DTYPES,
        "compute_dtype": axes.DTYPES, "orthogonalizer": axes.ORTHOGONALIZERS, "adjust_lr": axes.ADJUST_LR,
        "nesterov": (False, True), "weight_decay": axes.WEIGHT_DECAYS, "steps": axes.STEPS,
        "grad": axes.GRADIENTS, "optimizer": axes.OPTIMIZERS, "seed": tuple(seeds),
    }


def strength3(values: dict[str, tuple]) -> Space:
    """The space of `values` under CONSTRAINTS, every triple of its varying axes required."""
    return Space(values, CONSTRAINTS, (tuple(a for a, v in values.items() if len(v) > 1),))


def single_space(layers: Iterable[str], seeds: Iterable[int]) -> Space:
    """Single-process Muon and NorMuon cases over `layers`."""
    return strength3({**_common(layers, seeds), "layout": ("single",), "world_size": (1,)})


def distributed_space(layers: Iterable[str], world_sizes: Iterable[int], seeds: Iterable[int]) -> Space:
    """Distributed Muon and NorMuon cases over `layers` (replicated, Shard(0), Shard(1))."""
    return strength3({**_common(layers, seeds), "layout": layouts.DISTRIBUTED, "world_size": tuple(world_sizes)})


SPACES: dict[str, dict[str, Space]] = {
    "ci": {
        "single-process": single_space(axes.LAYERS, (0,)),
        "distributed": distributed_space(layouts.CI_LAYERS, layouts.CI_WORLD_SIZES, (0,)),
    },
    "nightly": {
        "single-process": single_space(axes.all_layers(), range(3)),
        "distributed": distributed_space(axes.all_layers(), layouts.NIGHTLY_WORLD_SIZES, range(2)),
    },
}
"""The covering-array spaces of each tier, by name (`python -m harness list --coverage` reports them)."""


def cases_of(space: Space) -> list[Case]:
    """The cases of the covering array of `space`."""
    return [Case(**{a: v for a, v in row.items() if a not in DERIVED}) for row in covering_array(space)]


GENERATORS: dict[str, list[Callable[[], Iterable[Case]]]] = {
    "ci": [functools.partial(cases_of, s) for s in SPACES["ci"].values()],
    "nightly": [functools.partial(cases_of, s) for s in SPACES["nightly"].values()],
}
"""What each tier is the union of; nightly also contains the whole CI tier."""


def _unique(cases: Iterable[Case]) -> list[Case]:
    return list(dict.fromkeys(cases))


@functools.cache
def _tier(name: str) -> tuple[Case, ...]:
    if name not in TIERS:
        raise ValueError(f"unknown tier {name!r}; expected one of {TIERS}")
    own = itertools.chain.from_iterable(g() for g in GENERATORS[name])
    return tuple(_unique(itertools.chain(_tier("ci") if name == "nightly" else (), own)))


def ci_cases() -> list[Case]:
    """The CI tier: small shapes, every pair of axis values, every triple of interacting axes."""
    return list(_tier("ci"))


def nightly_cases() -> list[Case]:
    """The nightly tier: the CI tier plus every triple of every axis, larger layers, more seeds."""
    return list(_tier("nightly"))


def tier(name: str) -> list[Case]:
    """Cases of tier `name` ("ci" or "nightly")."""
    return list(_tier(name))
