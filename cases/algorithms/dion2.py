"""Dion2's cases, and those of every selecting algorithm (NorDion2 too: `selecting()`), which share its
generators: fraction, selection scope and the layouts each allows cycle with the other axes."""

from __future__ import annotations

import itertools
from types import MappingProxyType
from typing import Iterator

from cases import axes, layouts
from cases.algorithms import AlgorithmCases, entry, selecting
from cases.case import Case

LAYERS_ = ("linear", "linear_tall", "conv1d", "conv2d", "conv2d_tall", "conv3d")
"""Wide and tall matrices (rows or columns selected), every conv kind, tall convs (columns)."""
DTYPES_ = (("fp32", "fp32"), ("bf16", "bf16"), ("fp64", "fp64"), ("fp32", "bf16"), ("bf16", "fp32"))


def selecting_single(layers: tuple[str, ...], variants: int, dtypes: tuple[tuple[str, str], ...], seeds: range
           ) -> Iterator[Case]:
    """Every selecting algorithm (Dion2, NorDion2) on one process: `variants` cases per optimizer x layer x flatten (both
    ways), megabatch size, fraction, dtype pair, orthogonalizer, lr mode and decay cycling; three
    steps, so the error feedback feeds later selections."""
    cycle = itertools.count()
    for optimizer, layer, seed in itertools.product(selecting(), layers, seeds):
        for flatten, _ in itertools.product(axes.flatten_values(layer), range(variants)):
            i = next(cycle)
            pd, cd = dtypes[i % len(dtypes)]
            orth = axes.ORTHOGONALIZERS[i % 3] if axes.compute_ok(axes.ORTHOGONALIZERS[i % 3], cd) else "polar_express"
            yield Case(layer=layer, megabatch=axes.MEGABATCH_SIZES[i % 4], flatten=flatten, param_dtype=pd,
                       compute_dtype=cd, orthogonalizer=orth, adjust_lr=axes.ADJUST_LR[i % 3], nesterov=False,
                       weight_decay=(0.0, 0.1)[(i // 2) % 2], steps=3, grad="gaussian", seed=seed,
                       optimizer=optimizer, fraction=axes.FRACTIONS[(i // 4) % 3])


def selecting_gradients(layer: str, grads: tuple[str, ...]) -> Iterator[Case]:
    """Every selecting algorithm: low-rank and degenerate gradients through the selection (zero: every norm ties)."""
    for optimizer, grad in itertools.product(selecting(), grads):
        yield Case(layer=layer, megabatch=2, flatten=True, param_dtype="fp32", compute_dtype="fp32",
                   orthogonalizer="polar_express", adjust_lr="spectral_norm", nesterov=False, weight_decay=0.0,
                   steps=2, grad=grad, optimizer=optimizer, fraction=0.25)


def selecting_distributed(layers: tuple[str, ...], world_sizes: tuple[int, ...], seeds: range,
                       every_size: bool) -> Iterator[Case]:
    """Dion2 replicated, Shard(0) and Shard(1), NorDion2 replicated and Shard(0) (it needs whole
    rows), both selection scopes; world sizes cycle (every_size: all of them), and so do the
    fraction, megabatch size and orthogonalizer."""
    cycle = itertools.count()
    for optimizer, layer, scope, seed in itertools.product(selecting(), layers, axes.SCOPES, seeds):
        layouts_ = entry(optimizer).layouts
        for layout, ws in itertools.product(layouts_, world_sizes if every_size else (None,)):
            i = next(cycle)
            yield Case(layer=layer, megabatch=(1, 2, 3)[i % 3], flatten=len(axes.all_layers()[layer][1]) > 2,
                       param_dtype="fp32", compute_dtype="fp32",
                       orthogonalizer=("polar_express", "newton_schulz", "svd")[i % 3],
                       adjust_lr=axes.ADJUST_LR[i % 3], nesterov=False, weight_decay=0.1, steps=3, grad="gaussian",
                       seed=seed, optimizer=optimizer, layout=layout,
                       world_size=ws or world_sizes[i % len(world_sizes)],
                       fraction=(0.25, 0.5)[(i // 3) % 2], scope=scope)


def scope_dependence(world_sizes: tuple[int, ...]) -> Iterator[Case]:
    """Dion2 on a row-sharded conv, both scopes, at every world size: the local scope's layout
    dependence is measured per world size, the global scope's invariance judged."""
    for scope, ws in itertools.product(axes.SCOPES, world_sizes):
        yield Case(layer="conv2d", megabatch=2, flatten=True, param_dtype="fp32", compute_dtype="fp32",
                   orthogonalizer="polar_express", adjust_lr="spectral_norm", nesterov=False, weight_decay=0.1,
                   steps=3, grad="gaussian", optimizer="dion2", layout="shard0", world_size=ws, fraction=0.25,
                   scope=scope)


ENTRY = AlgorithmCases("dion2", ("ef_decay",), selecting=True, generators=MappingProxyType({
    "ci": (lambda: selecting_single(LAYERS_, 2, DTYPES_, range(1)),
           lambda: selecting_gradients("conv2d", ("lowrank", "zero", "huge")),
           lambda: selecting_distributed(("conv2d", "linear_tall"), layouts.CI_WORLD_SIZES, range(1), every_size=False),
           lambda: scope_dependence(layouts.CI_WORLD_SIZES)),
    "nightly": (lambda: selecting_single(tuple(axes.all_layers()), 6, axes.DTYPE_PAIRS, range(2)),
                lambda: selecting_gradients("conv2d_big", axes.GRADIENTS[1:]),
                lambda: selecting_distributed(("linear", "linear_tall", "conv1d", "conv2d", "conv2d_tall", "conv3d",
                                               "conv2d_big"), layouts.NIGHTLY_WORLD_SIZES, range(1), every_size=True),
                lambda: scope_dependence(layouts.NIGHTLY_WORLD_SIZES)),
}))
