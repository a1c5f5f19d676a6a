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
sizes up to 8 and more seeds, and contains the CI tier. The gpu tier is a few hand-written cases of
layers large enough to engage the GPU fast paths (axes.GPU_LAYERS), run on CUDA only. The covering arrays
vary the algorithms whose case entry says `covered` (cases/algorithms/); every algorithm adds its own
generators (Dion2 and NorDion2: fraction and selection scope), and the tensor-parallel layouts and the
orthogonalizer- and dtype-specific envelopes come from generators below.
"""

from __future__ import annotations

import functools
import itertools
from typing import Callable, Iterable, Iterator

from cases import algorithms, axes, layouts, space, stored
from cases.case import Case
from cases.covering import Constraint, Space, covering_array

TIERS = ("ci", "nightly", "gpu")

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
    Constraint(("optimizer", "layout"), lambda opt, layout: layout == "single" or layout in algorithms.entry(opt).layouts,
               "the distributed layouts each algorithm allows (cases/algorithms/)"),
)

def _common(layers: Iterable[str], seeds: Iterable[int]) -> dict[str, tuple]:
    layers = tuple(layers)
    return {
        "layer": layers, "kind": tuple(dict.fromkeys(axes.all_layers()[n][0] for n in layers)),
        "megabatch": axes.MEGABATCH_SIZES, "flatten": (False, True), "param_dtype": axes.DTYPES,
        "compute_dtype": axes.DTYPES, "orthogonalizer": axes.ORTHOGONALIZERS, "adjust_lr": axes.ADJUST_LR,
        "nesterov": (False, True), "weight_decay": axes.WEIGHT_DECAYS, "steps": axes.STEPS,
        "grad": axes.GRADIENTS, "optimizer": algorithms.covered(),
        "seed": tuple(seeds),
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


def _bf16_envelope(layers: Iterable[str]) -> Iterator[Case]:
    """The envelope most real peers run in: 2-D weights orthogonalized in bf16 by a polynomial
    (torch.optim.Muon, and the bf16-only peers). Every combination of the axes that decide their
    numerics there (layer, schedule, parameter dtype, Nesterov, steps) is a case, Gaussian gradients,
    the other axes cycling: a strength-3 covering array of the whole space need not contain the
    5-way combination a defect needs (torch.optim.Muon's bf16 momentum bug shows only for bf16
    parameters, Newton-Schulz, no Nesterov, two or more steps)."""
    cycle = itertools.count()
    two_d = [name for name in layers if len(axes.all_layers()[name][1]) == 2]
    for layer, orth, pd, nesterov, steps in itertools.product(two_d, ("newton_schulz", "polar_express"),
                                                               ("fp32", "bf16"), (False, True), axes.STEPS):
        i = next(cycle)
        yield Case(layer=layer, megabatch=axes.MEGABATCH_SIZES[i % len(axes.MEGABATCH_SIZES)], flatten=False,
                   param_dtype=pd, compute_dtype="bf16", orthogonalizer=orth,
                   adjust_lr=("spectral_norm", "rms_norm")[i % 2], nesterov=nesterov,
                   weight_decay=axes.WEIGHT_DECAYS[(i // 2) % 2], steps=steps, grad="gaussian")


_GRAM_GRADIENTS = ("rankdef", "lowrank", "gaussian", "tiny", "huge", "zero")
"""Rank deficiency and a spectrum clustered near zero (lowrank: a few large singular values over a
small Gaussian floor) first: where Gram Newton-Schulz loses accuracy in half precision."""


def _gram_newton_schulz(layers: Iterable[str], dtypes: tuple[tuple[str, str], ...], variants: int
                        ) -> Iterator[Case]:
    """Gram Newton-Schulz: `variants` cases per layer (aspect ratios 1 to 16, flattened or as batches of
    their trailing matrices; square ones take the standard iteration), dtype pairs, gradient kinds,
    megabatch size, lr mode, Nesterov, decay and steps cycling."""
    cycle = itertools.count()
    for layer, _ in itertools.product(layers, range(variants)):
        i = next(cycle)
        pd, cd = dtypes[i % len(dtypes)]
        yield Case(layer=layer, megabatch=axes.MEGABATCH_SIZES[i % len(axes.MEGABATCH_SIZES)],
                   flatten=len(axes.all_layers()[layer][1]) > 2 and i % 3 != 2, param_dtype=pd, compute_dtype=cd,
                   orthogonalizer=axes.GRAM, adjust_lr=axes.ADJUST_LR[i % 3], nesterov=i % 2 == 1,
                   weight_decay=axes.WEIGHT_DECAYS[(i // 2) % 2], steps=axes.STEPS[(i // 3) % 2],
                   grad=_GRAM_GRADIENTS[i % len(_GRAM_GRADIENTS)])


_GRAM_PEER_DTYPES = (("fp32", "fp32"), ("fp32", "bf16"), ("bf16", "bf16"))
"""What the Gram peers compute in: DeepSpeed's gram method on CPU (fp32), gram-newton-schulz (bf16)."""


def _gram_peers(layers: Iterable[str]) -> Iterator[Case]:
    """Gram Newton-Schulz where the Gram peers can run it: Nesterov and lr mode spectral_norm (DeepSpeed's
    only ones), each layer of every dtype pair of _GRAM_PEER_DTYPES, 4-D layers flattened and the others
    not (as DeepSpeed views them); megabatch, decay, steps and gradient kind cycle."""
    for i, (layer, (d, (pd, cd))) in enumerate(itertools.product(layers, enumerate(_GRAM_PEER_DTYPES))):
        yield Case(layer=layer, megabatch=axes.MEGABATCH_SIZES[i % len(axes.MEGABATCH_SIZES)],
                   flatten=len(axes.all_layers()[layer][1]) == 4, param_dtype=pd, compute_dtype=cd,
                   orthogonalizer=axes.GRAM, adjust_lr="spectral_norm", nesterov=True,
                   weight_decay=axes.WEIGHT_DECAYS[i % 2], steps=axes.STEPS[(i // 2) % 2],
                   grad=_GRAM_GRADIENTS[(i // len(_GRAM_PEER_DTYPES) + 2 * d) % len(_GRAM_GRADIENTS)])


_TP_HEADS = {"linear": 4, "linear_tall": 4, "linear_wide_big": 8}
"""Heads of each TP layer: whole heads in every TP shard at tp 2 and 4 (12 rows: 4 heads of 3)."""
_TP_MESHES = ((1, 2), (1, 4), (2, 4))
"""(dp, world size): tp 2 and 4 alone on a 1-D "tp" mesh, and dp 2 x tp 2 on a 2-D mesh."""
_TP_DTYPES = (("fp64", "fp64"), ("fp32", "fp32"), ("fp32", "bf16"))


def _tensor_parallel(layers: Iterable[str]) -> Iterator[Case]:
    """Every valid TP layout (cases/layouts.py) of each layer: column- and row-parallel, both modes,
    with and without heads, on every mesh of _TP_MESHES; the other axes cycle."""
    cycle = itertools.count()
    for layer, (dp, ws), dim, mode, heads in itertools.product(layers, _TP_MESHES, (0, 1), layouts.TP_MODES,
                                                               (False, True)):
        tp = layouts.TensorParallel(dp, dim, mode, _TP_HEADS[layer] if heads else None)
        if layouts.tp_invalid(tp, ws, axes.all_layers()[layer][1]):
            continue
        i = next(cycle)
        pd, cd = _TP_DTYPES[i % len(_TP_DTYPES)]
        yield Case(layer=layer, megabatch=(1, 2, 3)[i % 3], flatten=False, param_dtype=pd, compute_dtype=cd,
                   orthogonalizer=("polar_express", "newton_schulz")[i % 2], adjust_lr=axes.ADJUST_LR[(i // 2) % 2],
                   nesterov=bool((i // 3) % 2), weight_decay=axes.WEIGHT_DECAYS[(i // 4) % 2], steps=2, grad="gaussian",
                   layout=tp.token(), world_size=ws)


_TP_CI = ("tp0-gather/ws2", "tp1-per_shard/ws2", "tp0-per_shard-h4/ws4", "dp2tp1-gather/ws4",
          "dp2tp0-per_shard-h4/ws4", "dp2tp0-gather-h4/ws4")
"""The CI tier's TP cases (of the linear layer): each mesh, both splits, both modes, heads."""


def _tensor_parallel_ci() -> Iterator[Case]:
    return (c for c in _tensor_parallel(("linear",)) if c.id.endswith(_TP_CI))


def _gpu_fast_paths() -> Iterator[Case]:
    """The GPU tier: few cases, each large enough to engage a fast path of ours (axes.GPU_LAYERS: a short side
    of 2048, where symmetric products go by blocks or, under the default fused=None, by the Triton kernel), one
    process on CUDA. Every orthogonalizer that forms symmetric products, bf16 compute (Polar Express and
    Newton-Schulz in bf16; Gram Newton-Schulz iterating in fp16, optimizers/gram_newton_schulz.py
    HALF_ITERATES) and fp32, wide, tall and a flattened conv, a megabatch of 2 (stacked blocks), bf16
    parameters, and 3 steps where CUDA graphs capture (the first step creates the state, the second is a fresh
    plan's first, eager; the third captures the plan's graph and replays it: optimizers/graphs.py). Gaussian
    gradients keep the bf16 references well posed (condition ~6); one fp32 case is low-rank. Kept to 18
    member-steps of the 2048-row layers: each costs FP64 SVDs of 2048 x 4096 on the host. One case of 768 x 2304
    reaches the kernel only inside the plan's graph (symmetric.GRAPHED_ROWS)."""
    def case(layer, mb, pd, cd, orth, adjust_lr, nesterov, wd, steps, grad):
        return Case(layer=layer, megabatch=mb, flatten=len(axes.GPU_LAYERS[layer][1]) > 2, param_dtype=pd,
                    compute_dtype=cd, orthogonalizer=orth, adjust_lr=adjust_lr, nesterov=nesterov, weight_decay=wd,
                    steps=steps, grad=grad)
    yield case("linear_gpu", 2, "fp32", "bf16", "polar_express", "spectral_norm", True, 0.1, 1, "gaussian")
    yield case("linear_gpu_tall", 1, "bf16", "bf16", "newton_schulz", "rms_norm", False, 0.0, 3, "gaussian")
    yield case("linear_gpu", 1, "fp32", "bf16", axes.GRAM, "none", True, 0.1, 3, "gaussian")
    yield case("conv2d_gpu", 1, "fp32", "fp32", axes.GRAM, "spectral_norm", False, 0.1, 1, "gaussian")
    yield case("linear_gpu_tall", 2, "fp32", "fp32", "polar_express", "none", True, 0.0, 1, "lowrank")
    yield case("conv2d_gpu", 1, "bf16", "bf16", "polar_express", "rms_norm", True, 0.0, 1, "gaussian")
    # Gram NS on an fp32 megabatch without Nesterov: with the fused momentum launch (fused=None on CUDA with
    # triton), its normaliser divides by the norms that launch forms (optimizers/elementwise.py), eagerly and,
    # at the third step, in the plan's CUDA graph
    yield case("linear_gpu", 2, "fp32", "bf16", axes.GRAM, "spectral_norm", False, 0.0, 3, "gaussian")
    # a short side below symmetric.TRITON_ROWS: the kernel only in the plan's CUDA graph (symmetric.GRAPHED_ROWS)
    yield case("linear_gpu_mid", 2, "bf16", "bf16", "polar_express", "rms_norm", True, 0.0, 3, "gaussian")


_EXTREME_DTYPES = (("fp32", "fp32", "polar_express"), ("fp32", "bf16", "newton_schulz"), ("bf16", "bf16", axes.GRAM),
                   ("fp64", "fp64", "polar_express"), ("fp64", "fp32", "svd"))
"""Extreme gradients (axes.EXTREME_GRADIENT): every orthogonalizer's normaliser, each compute dtype."""
_NONFINITE_DTYPES = (("fp32", "fp32", "polar_express"), ("bf16", "bf16", "newton_schulz"), ("fp64", "fp64", "svd"),
                     ("fp32", "bf16", axes.GRAM))
"""A NaN gradient element (axes.NONFINITE_GRADIENT) under every orthogonalizer."""


def _gradient_kind(grad: str, dtypes: tuple[tuple[str, str, str], ...]) -> Iterator[Case]:
    """Gradients of kind `grad` for every matrix algorithm at each (param, compute, orthogonalizer) of `dtypes`:
    a megabatch of two over two steps (the momentum sums extreme gradients; a NaN in member 0's last gradient
    leaves the other member to step as it does alone)."""
    for entry in algorithms.registry():
        if entry.elementwise:
            continue
        for pd, cd, orth in dtypes:
            yield Case(layer="linear", megabatch=2, flatten=False, param_dtype=pd, compute_dtype=cd,
                       orthogonalizer=orth, adjust_lr="spectral_norm", nesterov=not entry.selecting, weight_decay=0.1,
                       steps=2, grad=grad, optimizer=entry.name, fraction=0.5 if entry.selecting else None)


def algorithm_generators(tier: str) -> list[Callable[[], Iterable[Case]]]:
    """The generators every algorithm adds to `tier` (cases/algorithms/), in registry order."""
    return [g for e in algorithms.registry() for g in e.generators.get(tier, ())]


GENERATORS: dict[str, list[Callable[[], Iterable[Case]]]] = {
    "ci": [*(functools.partial(cases_of, s) for s in SPACES["ci"].values()),
           lambda: _bf16_envelope(axes.LAYERS),
           lambda: _gram_newton_schulz(axes.LAYERS, (("fp64", "fp64"), ("fp32", "fp32"), ("bf16", "bf16")), 2),
           lambda: _gram_peers(axes.LAYERS),
           *algorithm_generators("ci"),
           _tensor_parallel_ci,
           lambda: _gradient_kind(axes.EXTREME_GRADIENT, _EXTREME_DTYPES),
           lambda: _gradient_kind(axes.NONFINITE_GRADIENT, _NONFINITE_DTYPES)],
    "nightly": [*(functools.partial(cases_of, s) for s in SPACES["nightly"].values()),
                lambda: _bf16_envelope(axes.all_layers()),
                lambda: _gram_newton_schulz(axes.all_layers(), axes.DTYPE_PAIRS, 6),
                lambda: _gram_peers(axes.all_layers()),
                *algorithm_generators("nightly"),
                lambda: _tensor_parallel(("linear", "linear_tall", "linear_wide_big")),
                lambda: _gradient_kind(axes.EXTREME_GRADIENT, _EXTREME_DTYPES),
                lambda: _gradient_kind(axes.NONFINITE_GRADIENT, _NONFINITE_DTYPES)],
    "gpu": [_gpu_fast_paths],
}
"""What each tier is the union of; nightly also contains the whole CI tier; gpu holds only its own cases
(run it with --backend cuda; elsewhere each is skipped with the reason)."""


def _unique(cases: Iterable[Case]) -> list[Case]:
    return list(dict.fromkeys(cases))


@functools.cache
def written(name: str) -> tuple[Case, ...]:
    """The cases of tier `name` that its generators write (nightly's after the whole CI tier's)."""
    if name not in TIERS:
        raise ValueError(f"unknown tier {name!r}; expected one of {TIERS}")
    own = itertools.chain.from_iterable(g() for g in GENERATORS[name])
    return tuple(_unique(itertools.chain(_tier("ci") if name == "nightly" else (), own)))


def _everything(case: Case) -> None:
    """A target that supports every case."""
    return None


@functools.cache
def _tier(name: str) -> tuple[Case, ...]:
    """Tier `name`, as generated (`generate`) or read back from where it was stored (cases/stored.py)."""
    return stored.stored_or_generated(name, lambda: generate(name))


def generate(name: str) -> tuple[Case, ...]:
    """The written cases, then the rows of a covering array of the tier's full axis space (cases/space.py)
    that they leave to cover: the tier of a target that supports every case."""
    cases = written(name)
    if name not in space.SPACES:
        return cases
    rows = [c for part in (False, True) for c in space.supported_covering(space.SPACES[name], part, _everything,
                                                                          cases).rows]
    return tuple(_unique(itertools.chain(cases, rows)))


def ci_cases() -> list[Case]:
    """The CI tier: small shapes, every pair of axis values, every triple of interacting axes."""
    return list(_tier("ci"))


def gpu_cases() -> list[Case]:
    """The GPU tier: few cases large enough to engage every fast path, CUDA only."""
    return list(_tier("gpu"))


def nightly_cases() -> list[Case]:
    """The nightly tier: the CI tier plus every triple of every axis, larger layers, more seeds."""
    return list(_tier("nightly"))


def tier(name: str) -> list[Case]:
    """Cases of tier `name` ("ci", "nightly" or "gpu")."""
    return list(_tier(name))
