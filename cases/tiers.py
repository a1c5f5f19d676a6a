"""The CI and nightly tiers: deterministic lists of cases built from the axes.

CI covers every layer x megabatch size x flatten x orthogonalizer at fp32, then
sweeps dtypes, gradient kinds and hyper-parameters on a few layers; secondary axes
cycle through their values so each value appears. Dion2 and NorDion2 add 72 cases
(46 single-process, 26 on gloo ranks). Nightly is the full product of
the CI grid with more seeds, the larger layers and every dtype pairing.
"""

from __future__ import annotations

import itertools
from typing import Iterator

from cases import axes, layouts
from cases.case import Case

TIERS = ("ci", "nightly")

def _flatten_values(layer: str) -> tuple[bool, ...]:
    shape = axes.all_layers()[layer][1]
    return (False, True) if len(shape) > 2 else (False,)


def _grid(layers: list[str], seeds: range) -> Iterator[Case]:
    cycle = itertools.count()
    for layer, mb, orth, seed in itertools.product(layers, axes.MEGABATCH_SIZES, axes.ORTHOGONALIZERS, seeds):
        for flatten in _flatten_values(layer):
            i = next(cycle)
            yield Case(layer=layer, megabatch=mb, flatten=flatten, param_dtype="fp32", compute_dtype="fp32",
                       orthogonalizer=orth, adjust_lr=axes.ADJUST_LR[i % 3], nesterov=bool(i % 2),
                       weight_decay=(0.0, 0.1)[(i // 2) % 2], steps=(1, 3)[(i // 3) % 2],
                       grad=("gaussian", "lowrank")[(i // 5) % 2], seed=seed)


def _dtypes(layers: list[str], megabatches: tuple[int, ...]) -> Iterator[Case]:
    for (pd, cd), orth, layer, mb in itertools.product(axes.DTYPE_PAIRS, axes.ORTHOGONALIZERS, layers, megabatches):
        if axes.compute_ok(orth, cd):
            for flatten in _flatten_values(layer)[-1:]:
                yield Case(layer=layer, megabatch=mb, flatten=flatten, param_dtype=pd, compute_dtype=cd,
                           orthogonalizer=orth, adjust_lr="spectral_norm", nesterov=True, weight_decay=0.1,
                           steps=3, grad="gaussian")


def _gradients(layers: list[str], dtypes: tuple[tuple[str, str], ...]) -> Iterator[Case]:
    for grad, orth, layer, (pd, cd) in itertools.product(axes.GRADIENTS[1:], axes.ORTHOGONALIZERS, layers, dtypes):
        if axes.compute_ok(orth, cd):
            yield Case(layer=layer, megabatch=2, flatten=True, param_dtype=pd, compute_dtype=cd,
                       orthogonalizer=orth, adjust_lr="spectral_norm", nesterov=False, weight_decay=0.0,
                       steps=2, grad=grad)


def _hyper(layer: str) -> Iterator[Case]:
    for adjust, nesterov, wd, steps in itertools.product(axes.ADJUST_LR, (False, True), (0.0, 0.1), (1, 3)):
        yield Case(layer=layer, megabatch=2, flatten=True, param_dtype="fp32", compute_dtype="fp32",
                   orthogonalizer="polar_express", adjust_lr=adjust, nesterov=nesterov, weight_decay=wd,
                   steps=steps, grad="gaussian")


def _normuon(layers: list[str], dtypes: tuple[tuple[str, str], ...], seeds: range) -> Iterator[Case]:
    """NorMuon: conv vs equivalent matrices (flatten both ways), every megabatch size, several
    steps so the row variance accumulates, every lr mode, the given dtype pairs."""
    cycle = itertools.count()
    for layer, mb, (pd, cd), seed in itertools.product(layers, axes.MEGABATCH_SIZES, dtypes, seeds):
        for flatten in _flatten_values(layer):
            i = next(cycle)
            yield Case(layer=layer, megabatch=mb, flatten=flatten, param_dtype=pd, compute_dtype=cd,
                       orthogonalizer=("polar_express", "newton_schulz", "svd")[i % 3] if cd != "bf16"
                       else ("polar_express", "newton_schulz")[i % 2],
                       adjust_lr=axes.ADJUST_LR[i % 3], nesterov=bool(i % 2), weight_decay=(0.0, 0.1)[(i // 2) % 2],
                       steps=3, grad=("gaussian", "lowrank", "gaussian", "zero")[i % 4], seed=seed, optimizer="normuon")


def _normuon_distributed(layers: tuple[str, ...], world_sizes: tuple[int, ...], seeds: range) -> Iterator[Case]:
    """NorMuon replicated and row-sharded (Shard(0): even, uneven, empty rows); column shards are
    refused by NorMuon, so they are no case."""
    cycle = itertools.count()
    for layer, layout, ws, seed in itertools.product(layers, ("replicated", "shard0"), world_sizes, seeds):
        i = next(cycle)
        yield Case(layer=layer, megabatch=(2, 3)[i % 2], flatten=len(axes.all_layers()[layer][1]) > 2,
                   param_dtype="fp32", compute_dtype="fp32", orthogonalizer=("polar_express", "newton_schulz")[i % 2],
                   adjust_lr=axes.ADJUST_LR[i % 3], nesterov=bool(i % 2), weight_decay=0.1, steps=3, grad="gaussian",
                   seed=seed, optimizer="normuon", layout=layout, world_size=ws)


_DION2_LAYERS = ("linear", "linear_tall", "conv1d", "conv2d", "conv2d_tall", "conv3d")
"""Wide and tall matrices (rows or columns selected), every conv kind, tall convs (columns)."""
_DION2_DTYPES = (("fp32", "fp32"), ("bf16", "bf16"), ("fp64", "fp64"), ("fp32", "bf16"), ("bf16", "fp32"))


def _dion2(layers: tuple[str, ...], variants: int, dtypes: tuple[tuple[str, str], ...], seeds: range
           ) -> Iterator[Case]:
    """Dion2 and NorDion2 on one process: `variants` cases per optimizer x layer x flatten (both
    ways), megabatch size, fraction, dtype pair, orthogonalizer, lr mode and decay cycling; three
    steps, so the error feedback feeds later selections."""
    cycle = itertools.count()
    for optimizer, layer, seed in itertools.product(axes.SELECTING, layers, seeds):
        for flatten, _ in itertools.product(_flatten_values(layer), range(variants)):
            i = next(cycle)
            pd, cd = dtypes[i % len(dtypes)]
            orth = axes.ORTHOGONALIZERS[i % 3] if axes.compute_ok(axes.ORTHOGONALIZERS[i % 3], cd) else "polar_express"
            yield Case(layer=layer, megabatch=axes.MEGABATCH_SIZES[i % 4], flatten=flatten, param_dtype=pd,
                       compute_dtype=cd, orthogonalizer=orth, adjust_lr=axes.ADJUST_LR[i % 3], nesterov=False,
                       weight_decay=(0.0, 0.1)[(i // 2) % 2], steps=3, grad="gaussian", seed=seed,
                       optimizer=optimizer, fraction=axes.FRACTIONS[(i // 4) % 3])


def _dion2_gradients(layer: str, grads: tuple[str, ...]) -> Iterator[Case]:
    """Low-rank and degenerate gradients through the selection (zero: every norm ties)."""
    for optimizer, grad in itertools.product(axes.SELECTING, grads):
        yield Case(layer=layer, megabatch=2, flatten=True, param_dtype="fp32", compute_dtype="fp32",
                   orthogonalizer="polar_express", adjust_lr="spectral_norm", nesterov=False, weight_decay=0.0,
                   steps=2, grad=grad, optimizer=optimizer, fraction=0.25)


def _dion2_distributed(layers: tuple[str, ...], world_sizes: tuple[int, ...], seeds: range,
                       every_size: bool) -> Iterator[Case]:
    """Dion2 replicated, Shard(0) and Shard(1), NorDion2 replicated and Shard(0) (it needs whole
    rows), both selection scopes; world sizes cycle (every_size: all of them), and so do the
    fraction, megabatch size and orthogonalizer."""
    cycle = itertools.count()
    for optimizer, layer, scope, seed in itertools.product(axes.SELECTING, layers, axes.SCOPES, seeds):
        layouts_ = ("replicated", "shard0") if optimizer == "nordion2" else layouts.DISTRIBUTED
        for layout, ws in itertools.product(layouts_, world_sizes if every_size else (None,)):
            i = next(cycle)
            yield Case(layer=layer, megabatch=(1, 2, 3)[i % 3], flatten=len(axes.all_layers()[layer][1]) > 2,
                       param_dtype="fp32", compute_dtype="fp32",
                       orthogonalizer=("polar_express", "newton_schulz", "svd")[i % 3],
                       adjust_lr=axes.ADJUST_LR[i % 3], nesterov=False, weight_decay=0.1, steps=3, grad="gaussian",
                       seed=seed, optimizer=optimizer, layout=layout,
                       world_size=ws or world_sizes[i % len(world_sizes)],
                       fraction=(0.25, 0.5)[(i // 3) % 2], scope=scope)


def _dion2_scope_dependence(world_sizes: tuple[int, ...]) -> Iterator[Case]:
    """Dion2 on a row-sharded conv, both scopes, at every world size: the local scope's layout
    dependence is measured per world size, the global scope's invariance judged."""
    for scope, ws in itertools.product(axes.SCOPES, world_sizes):
        yield Case(layer="conv2d", megabatch=2, flatten=True, param_dtype="fp32", compute_dtype="fp32",
                   orthogonalizer="polar_express", adjust_lr="spectral_norm", nesterov=False, weight_decay=0.1,
                   steps=3, grad="gaussian", optimizer="dion2", layout="shard0", world_size=ws, fraction=0.25,
                   scope=scope)


def _unique(cases: Iterator[Case]) -> list[Case]:
    return list(dict.fromkeys(cases))


def ci_cases() -> list[Case]:
    """The CI tier: small shapes, every axis value present."""
    layers = list(axes.LAYERS)
    return _unique(itertools.chain(
        _grid(layers, range(1)),
        _dtypes(["linear", "linear_tall", "conv2d", "conv3d"], (1, 3)),
        _gradients(["linear_tall", "conv2d"], (("fp32", "fp32"), ("bf16", "bf16"))),
        _hyper("conv2d"),
        layouts.distributed_cases(layouts.CI_LAYERS, layouts.CI_WORLD_SIZES, range(1)),
        _normuon(["linear", "conv1d", "conv2d", "conv2d_k1", "conv3d"], (("fp32", "fp32"), ("bf16", "bf16")), range(1)),
        _normuon_distributed(layouts.CI_LAYERS, layouts.CI_WORLD_SIZES, range(1)),
        _dion2(_DION2_LAYERS, 2, _DION2_DTYPES, range(1)),
        _dion2_gradients("conv2d", ("lowrank", "zero", "huge")),
        _dion2_distributed(("conv2d", "linear_tall"), layouts.CI_WORLD_SIZES, range(1), every_size=False),
        _dion2_scope_dependence(layouts.CI_WORLD_SIZES),
    ))


def nightly_cases() -> list[Case]:
    """The nightly tier: CI plus more seeds, larger layers and every dtype pairing."""
    every = list(axes.all_layers())
    return _unique(itertools.chain(
        ci_cases(),
        _grid(every, range(3)),
        _dtypes(every, axes.MEGABATCH_SIZES),
        _gradients(every, axes.DTYPE_PAIRS),
        _hyper("conv2d_big"),
        _hyper("conv1d"),
        layouts.distributed_cases(tuple(every), layouts.NIGHTLY_WORLD_SIZES, range(2)),
        _normuon(every, axes.DTYPE_PAIRS, range(2)),
        _normuon_distributed(tuple(every), layouts.NIGHTLY_WORLD_SIZES, range(2)),
        _dion2(tuple(every), 6, axes.DTYPE_PAIRS, range(2)),
        _dion2_gradients("conv2d_big", axes.GRADIENTS[1:]),
        _dion2_distributed(("linear", "linear_tall", "conv1d", "conv2d", "conv2d_tall", "conv3d", "conv2d_big"),
                           layouts.NIGHTLY_WORLD_SIZES, range(1), every_size=True),
        _dion2_scope_dependence(layouts.NIGHTLY_WORLD_SIZES),
    ))


def tier(name: str) -> list[Case]:
    """Cases of tier `name` ("ci" or "nightly")."""
    if name == "ci":
        return ci_cases()
    if name == "nightly":
        return nightly_cases()
    raise ValueError(f"unknown tier {name!r}; expected one of {TIERS}")
