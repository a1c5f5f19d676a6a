"""The full axis space of a tier, and a covering array over the part of it a target supports.

A tier's space is every value of every case axis the tier may use (`SPACES`): every algorithm with its own
hyper-parameters, every layer of the tier (flattened or not), every dtype pair, orthogonalizer, lr scale,
weight decay and lr, momentum, beta2 and error-feedback decay, steps, gradient kind and seed, and, in the
distributed part, every layout and world size. `sample` draws valid cases from it at random (each axis
uniformly where the algorithm and the layer allow it), deterministically from a seed.

`supported_covering(space, supports, seeds)` is what a target is judged on: a covering array of the cases
`supports(case)` accepts. The required combinations are every pair of axis values and every triple of
values over the interacting axes (`GROUPS`), among those some supported case contains. Which ones that is,
is learned from witnesses: the `seeds` the target supports (the global tier's cases it accepts, which are
kept as rows, so their ids stay), random supported draws, and, for a narrow target, every case one or two axes
away from those (so a handful of supported draws still shows every value and pair it accepts). A target so
narrow that no seed or draw is supported gets a witness by `search`, which follows what its adapter reads. Rows are then chosen
greedily: the witness completing the most uncovered combinations, ties to the earliest drawn. Everything is seeded and ordered: the same space, target and seeds give the same rows.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

from cases import algorithms, axes, layouts
from cases.case import Case

AXES = ("optimizer", "fraction", "ef_decay", "beta2", "scope", "layer", "kind", "megabatch", "flatten",
        "param_dtype", "compute_dtype", "orthogonalizer", "adjust_lr", "nesterov", "momentum", "weight_decay",
        "lr", "steps", "grad", "seed", "layout", "world_size")
"""The axes a covering array combines: every field of `Case` but `NOT_COMBINED`, and the layer's kind."""

NOT_COMBINED = ("construct",)
"""Case fields no covering array varies: a defaults case holds one target's documented defaults, so it is a row
that target's own tier adds (harness/running/selection.py: `defaults_rows`)."""

GROUPS = (
    ("kind", "flatten", "grad", "optimizer", "compute_dtype"),
    ("layer", "megabatch", "flatten"),
    ("param_dtype", "compute_dtype", "orthogonalizer", "nesterov", "steps"),
    ("optimizer", "momentum", "beta2", "ef_decay"),
    ("optimizer", "weight_decay", "lr", "param_dtype"),
    ("layer", "layout", "world_size"),
    ("megabatch", "layout", "world_size"),
    ("optimizer", "layout", "scope"),
)
"""Interacting axes, every triple of each covered: a layer kind's matrix view, flattening and gradient
through each algorithm and compute format; members of a megabatch that must not mix; the numerics of the
parameter and compute formats, the schedule, Nesterov and accumulated steps (torch.optim.Muon's bf16
momentum buffer needs four of them); hyper-parameters that a defect may swap; a decay factor that rounds
in a low-precision format; shards of each layer on each world size, megabatch members over their owners,
and each algorithm's layouts and selection scopes."""


@dataclass(frozen=True)
class Space:
    """The values of a tier's axes: `layers` (matrix layers; `vector_layers` for the elementwise
    algorithms too), world sizes of its distributed part, seeds, and the tier's `tensor_parallel` layouts."""

    name: str
    layers: tuple[str, ...]
    vector_layers: tuple[str, ...]
    world_sizes: tuple[int, ...]
    seeds: tuple[int, ...]
    tensor_parallel: tuple[str, ...]


SPACES = {
    "ci": Space("ci", tuple(axes.LAYERS), tuple(axes.VECTOR_LAYERS), layouts.CI_WORLD_SIZES, (0,),
                ("tp0-gather", "tp1-per_shard", "tp0-per_shard-h4", "dp2tp1-gather")),
    "nightly": Space("nightly", tuple(axes.all_layers()), tuple(axes.VECTOR_LAYERS), layouts.NIGHTLY_WORLD_SIZES,
                     (0, 1, 2), ("tp0-gather", "tp1-gather", "tp0-per_shard", "tp1-per_shard", "tp0-per_shard-h4",
                                 "dp2tp0-gather", "dp2tp1-gather", "dp2tp0-per_shard-h4")),
}


def _pick(rng: random.Random, values: Iterable) -> object:
    values = tuple(values)
    return values[rng.randrange(len(values))]


def _draw(rng: random.Random, space: Space, distributed: bool) -> Case:
    """One case drawn from `space` (ValueError where the draw is no valid case)."""
    entry = _pick(rng, algorithms.registry())
    elementwise = entry.elementwise
    layer = _pick(rng, space.layers + (space.vector_layers if elementwise else ()))
    shape = axes.known_layers()[layer][1]
    pd, cd = _pick(rng, axes.ELEMENTWISE_DTYPE_PAIRS if elementwise else axes.DTYPE_PAIRS)
    orth = "none" if elementwise else _pick(rng, [o for o in axes.EVERY_ORTHOGONALIZER if axes.compute_ok(o, cd)])
    hyper = {name: _pick(rng, axes.HYPER_VALUES[name]) for name in entry.hyper}
    layout, world_size, scope = "single", 1, None
    if distributed:
        tp = space.tensor_parallel if entry.tensor_parallel and len(shape) == 2 else ()
        layout = _pick(rng, entry.layouts + tp)
        world_size = _pick(rng, space.world_sizes)
        scope = _pick(rng, axes.SCOPES) if entry.selecting else None
    return Case(layer=layer, megabatch=_pick(rng, axes.MEGABATCH_SIZES),
                flatten=False if elementwise or len(shape) < 2 else _pick(rng, (False, True)),
                param_dtype=pd, compute_dtype=cd, orthogonalizer=orth,
                adjust_lr="none" if elementwise else _pick(rng, axes.ADJUST_LR),
                nesterov=False if entry.selecting or elementwise else _pick(rng, (False, True)),
                weight_decay=_pick(rng, axes.DECAYS), steps=_pick(rng, axes.STEPS),
                grad=_pick(rng, axes.GRADIENTS if len(shape) > 1 else axes.VECTOR_GRADIENTS),
                seed=_pick(rng, space.seeds), optimizer=entry.name, layout=layout, world_size=world_size,
                fraction=_pick(rng, axes.FRACTIONS) if entry.selecting else None, scope=scope,
                lr=_pick(rng, axes.LRS), **hyper)


def sample(space: Space, distributed: bool, count: int, seed: int = 0) -> Iterator[Case]:
    """`count` valid cases drawn from `space`'s single-process (or distributed) part, in draw order."""
    rng = random.Random(f"{space.name}/{distributed}/{seed}")
    made = 0
    while made < count:
        try:
            case = _draw(rng, space, distributed)
        except ValueError:
            continue
        made += 1
        yield case


def values_of(case: Case) -> tuple:
    """The case's value on each of `AXES`."""
    return tuple(case.kind if a == "kind" else getattr(case, a) for a in AXES)


_TRIPLES = sorted({tuple(sorted(AXES.index(a) for a in t)) for g in GROUPS for t in itertools.combinations(g, 3)})


def combinations(cases: list[Case]) -> np.ndarray:
    """[len(cases), C] integer codes: per case every pair of its axis values and every triple over an
    interacting group, numbered consistently across `cases` (equal codes, equal combinations)."""
    if not cases:
        return np.zeros((0, 0), dtype=np.int64)
    columns = list(zip(*map(values_of, cases)))
    atoms = np.empty((len(cases), len(AXES)), dtype=np.int64)
    offset = 0
    for i, column in enumerate(columns):
        numbered = {v: n for n, v in enumerate(dict.fromkeys(column))}
        atoms[:, i] = [offset + numbered[v] for v in column]
        offset += len(numbered)
    pairs = [atoms[:, i] << 20 | atoms[:, j] for i, j in itertools.combinations(range(len(AXES)), 2)]
    triples = [(atoms[:, i] << 40 | atoms[:, j] << 20 | atoms[:, k]) | (1 << 60) for i, j, k in _TRIPLES]
    return np.stack(pairs + triples, axis=1)


def neighbours(case: Case, space: Space) -> Iterator[Case]:
    """Every valid case one axis value away from `case` (in the space's values), in axis order."""
    entry = algorithms.entry(case.optimizer)
    choices = {
        "layer": space.layers + (space.vector_layers if entry.elementwise else ()),
        "megabatch": axes.MEGABATCH_SIZES, "flatten": (False, True), "orthogonalizer": axes.EVERY_ORTHOGONALIZER,
        "adjust_lr": axes.ADJUST_LR, "nesterov": (False, True), "weight_decay": axes.DECAYS, "lr": axes.LRS,
        "steps": axes.STEPS, "grad": axes.GRADIENTS, "seed": space.seeds,
        **{name: axes.HYPER_VALUES[name] for name in entry.hyper},
        **({"fraction": axes.FRACTIONS} if case.fraction is not None else {}),
        **({"world_size": space.world_sizes} if case.world_size > 1 else {}),
    }
    for name, values in choices.items():
        for value in values:
            if value == getattr(case, name):
                continue
            try:
                yield dataclasses.replace(case, **{name: value})
            except ValueError:
                continue
    for pd, cd in axes.ELEMENTWISE_DTYPE_PAIRS if entry.elementwise else axes.DTYPE_PAIRS:
        if (pd, cd) != (case.param_dtype, case.compute_dtype):
            try:
                yield dataclasses.replace(case, param_dtype=pd, compute_dtype=cd)
            except ValueError:
                continue


class _Traced(Case):
    """A case that notes, in order, which of its fields are read: what an adapter's `unsupported` looked at
    before it refused (its `_reads`, set after construction)."""

    def __getattribute__(self, name: str) -> object:
        if name in _FIELDS:
            reads = object.__getattribute__(self, "__dict__").get("_reads")
            if reads is not None:
                reads.append(name)
        return object.__getattribute__(self, name)


_FIELDS = frozenset(f.name for f in dataclasses.fields(Case))


def _traced(case: Case, supports: Callable[[Case], str | None]) -> tuple[list[str], str | None]:
    """(the fields `supports` read, in order, its answer) for `case`."""
    probe = _Traced(**{name: getattr(case, name) for name in _FIELDS})
    object.__setattr__(probe, "_reads", [])
    why = supports(probe)
    return object.__getattribute__(probe, "_reads"), why


def _moved(case: Case, axis: str, value: object) -> Case:
    """`case` with `axis` set to `value`, the fields that must change with it changed too (another algorithm's
    fraction, Nesterov form, orthogonalizer and hyper-parameters; a compute format the parameter format
    allows); ValueError where no valid case results."""
    if axis != "optimizer":
        if axis == "param_dtype" and (value, case.compute_dtype) not in axes.DTYPE_PAIRS:
            return dataclasses.replace(case, param_dtype=value, compute_dtype=value)
        if axis == "compute_dtype" and (case.param_dtype, value) not in axes.DTYPE_PAIRS:
            param = next(p for p, c in axes.DTYPE_PAIRS if c == value)
            return dataclasses.replace(case, param_dtype=param, compute_dtype=value)
        return dataclasses.replace(case, **{axis: value})
    entry = algorithms.entry(value)
    changes: dict[str, object] = {"optimizer": value, **{h: axes.HYPER_DEFAULTS[h] for h in ("momentum", "beta2",
                                                                                               "ef_decay")}}
    changes["fraction"] = (case.fraction or 0.5) if entry.selecting else None
    changes["scope"] = (case.scope or "global") if entry.selecting and case.world_size > 1 else None
    if entry.selecting or entry.elementwise:
        changes["nesterov"] = False
    if entry.elementwise:
        changes.update(orthogonalizer=axes.NO_ORTHOGONALIZER, adjust_lr="none", flatten=False,
                       compute_dtype=case.param_dtype)
    elif case.orthogonalizer == axes.NO_ORTHOGONALIZER:
        changes.update(orthogonalizer="newton_schulz", adjust_lr="spectral_norm")
    return dataclasses.replace(case, **changes)


def _choices(axis: str, case: Case, space: Space) -> tuple:
    """The values the witness search tries for `axis`."""
    if axis == "optimizer":
        return algorithms.names()
    if axis == "layer":
        return space.layers + space.vector_layers
    if axis in axes.HYPER_VALUES:
        return axes.HYPER_VALUES[axis]
    return {"megabatch": axes.MEGABATCH_SIZES, "flatten": (False, True), "param_dtype": axes.DTYPES,
            "compute_dtype": axes.DTYPES, "orthogonalizer": axes.EVERY_ORTHOGONALIZER,
            "adjust_lr": axes.ADJUST_LR, "nesterov": (False, True), "weight_decay": axes.DECAYS, "lr": axes.LRS,
            "steps": axes.STEPS, "grad": axes.GRADIENTS, "seed": space.seeds, "fraction": axes.FRACTIONS,
            "scope": axes.SCOPES, "world_size": space.world_sizes}.get(axis, ())


SEARCH_STEPS = 60
"""The most moves of one witness search."""


def search(start: Case, supports: Callable[[Case], str | None], space: Space) -> Case | None:
    """A case `supports` accepts, found from `start` by moves of one field at a time, or None.

    An adapter refuses a case at the first condition it fails, reading the fields that condition names on the
    way: a move to a value that lets it read further (it passed that condition), or as far with another
    reason, is progress. Each step tries the fields it read, the last read first, each value in order."""
    case = start
    reads, why = _traced(case, supports)
    for _ in range(SEARCH_STEPS):
        if why is None:
            return case
        for axis in reversed(list(dict.fromkeys(reads))):
            found = None
            for value in _choices(axis, case, space):
                if value == getattr(case, axis):
                    continue
                try:
                    moved = _moved(case, axis, value)
                except ValueError:
                    continue
                got, answer = _traced(moved, supports)
                if answer is None or len(got) > len(reads) or (len(got) == len(reads) and answer != why):
                    found = moved, got, answer
                    break
            if found:
                case, reads, why = found
                break
        else:
            return None
    return case if why is None else None


@dataclass(frozen=True)
class Support:
    """What a covering of a target's supported cases found: `rows` (the cases to judge, the seeds it
    accepted first), `required` and `covered` combinations, `values` the axis values some supported case has,
    and `reasons`: why the drawn cases it does not support are unsupported, with how many."""

    rows: tuple[Case, ...]
    required: int
    covered: int
    values: dict[str, frozenset]
    reasons: Counter
    drawn: int


SAMPLES = 6000
"""Cases drawn from the space per part (single-process, distributed) to find a target's supported ones."""
NEIGHBOURHOOD = 400
"""Below this many supported cases found, every case one axis away from each is tried too, for up to
NEIGHBOUR_ROUNDS rounds (each from the cases the last one found)."""
NEIGHBOUR_ROUNDS = 2


def supported_covering(space: Space, distributed: bool, supports: Callable[[Case], str | None],
                       seeds: Iterable[Case] = (), samples: int = SAMPLES) -> Support:
    """A covering array of the cases of `space` (its distributed part, or its single-process one) that
    `supports` accepts (returns None for), beginning with the accepted `seeds` (module docstring)."""
    reasons: Counter = Counter()
    seen: set[Case] = set()

    def accepted(case: Case) -> bool:
        if case in seen:
            return False
        seen.add(case)
        why = supports(case)
        if why is not None:
            reasons[why] += 1
        return why is None

    seeds = [c for c in seeds if (c.world_size > 1) == distributed]
    first = [c for c in seeds if accepted(c)]
    drawn = [c for c in sample(space, distributed, samples) if accepted(c)]
    if not first and not drawn:  # none drawn: search from one seed of each algorithm
        starts = {c.optimizer: c for c in reversed(seeds)}.values()
        drawn = [found for start in starts if (found := search(start, supports, space)) is not None][:1]
        seen.update(drawn)
    fresh = first + drawn
    for _ in range(NEIGHBOUR_ROUNDS):
        if not fresh or len(first) + len(drawn) >= NEIGHBOURHOOD:
            break
        fresh = [n for c in fresh for n in neighbours(c, space) if accepted(n)]
        drawn += fresh
    witnesses = first + drawn
    codes = np.unique(combinations(witnesses), return_inverse=True)[1].reshape(len(witnesses), -1) \
        if witnesses else np.zeros((0, 0), dtype=np.int64)
    covered = np.zeros(int(codes.max()) + 1 if codes.size else 0, dtype=bool)
    covered[codes[:len(first)].ravel()] = True
    rows = list(first)
    candidates = np.arange(len(first), len(witnesses))
    while candidates.size:
        gains = (~covered[codes[candidates]]).sum(axis=1)
        candidates = candidates[gains > 0]
        if not candidates.size:
            break
        best = candidates[int(np.argmax(gains[gains > 0]))]  # the first drawn among the best
        covered[codes[best]] = True
        rows.append(witnesses[best])
    values = {a: frozenset(column) for a, column in zip(AXES, zip(*map(values_of, witnesses)))} if witnesses else {}
    return Support(tuple(rows), int(covered.size), int(covered.sum()), values, reasons, len(seen))
