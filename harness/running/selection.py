"""Choosing the cases of a run: a target's own tier, narrowed by --select.

A target is judged on its own tier (`target_tier`): the global tier's cases it supports, then a covering
array of the tier's full axis space restricted to what it supports (cases/space.py), so that every value and
every pair of values it accepts is judged, however narrow it is, then its cases with extreme and non-finite
gradients where it has none (`range_rows`), then cases built from the defaults it declares
(`defaults_rows`). A target that supports every case and declares no defaults gets the global tier itself.
Which cases a target supports is what its adapter answers (harness.targets.base.why_unsupported:
`unsupported(case)`, and a distributed or tensor-parallel layout only where it has those methods), asked of
the global tier's cases and of cases drawn from the space.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cases import Case, algorithms, space, tier
from cases.axes import EXTREME_GRADIENT, NO_ORTHOGONALIZER, NONFINITE_GRADIENT
from harness.targets.base import Target, distributed_maker, why_unsupported


@dataclass(frozen=True)
class TargetTier:
    """A target's tier: `cases` (in order: the global tier's it supports, then the rows it adds), how many
    of the global tier's cases it does not support (`unsupported`) and why (`reasons`: each reason with the
    count of the global tier's cases it was given for), and `values`: per case axis, the values some case
    it supports takes."""

    name: str
    cases: tuple[Case, ...]
    unsupported: int
    reasons: Counter
    values: dict[str, frozenset]


def target_tier(tier_name: str, target: Target) -> TargetTier:
    """The tier `tier_name` of `target` (module docstring). Its distributed part is drawn only for a target
    with a distributed adapter (`make_distributed`)."""
    every = tier(tier_name)
    known: dict[Case, str | None] = {c: why_unsupported(target, c) for c in every}

    def supports(case: Case) -> str | None:
        return known[case] if case in known else why_unsupported(target, case)

    values: dict[str, set] = {}
    rows: list[Case] = [c for c, why in known.items() if why is None]
    if tier_name in space.SPACES:
        for distributed in (False, True) if distributed_maker(target) is not None else (False,):
            found = space.supported_covering(space.SPACES[tier_name], distributed, supports, every)
            rows += found.rows
            for axis, seen in found.values.items():
                values.setdefault(axis, set()).update(seen)
        extra = range_rows(rows, supports) + defaults_rows(target, supports)
        rows += extra
        for case in extra:
            for axis, value in zip(space.AXES, space.values_of(case)):
                values.setdefault(axis, set()).add(value)
    order = {c: n for n, c in enumerate(every)}
    ordered = sorted(dict.fromkeys(rows), key=lambda c: order.get(c, len(order)))
    return TargetTier(tier_name, tuple(ordered), sum(why is not None for why in known.values()),
                      Counter(why for why in known.values() if why is not None),
                      {a: frozenset(v) for a, v in values.items()})


RANGE_GRADIENTS = (EXTREME_GRADIENT, NONFINITE_GRADIENT)
"""Gradient kinds the covering space leaves out: the global tiers have written cases of each (cases/tiers.py),
in a few formats that a narrow target may support none of."""


def range_rows(rows: list[Case], supports: Callable[[Case], str | None]) -> list[Case]:
    """For each kind of RANGE_GRADIENTS that no case of `rows` has: the single-process cases of `rows` with
    gradients of that kind (as a megabatch of two over two steps, as the written cases are, where `supports`
    accepts that, else as they are), one per (parameter, compute, orthogonalizer) format of a matrix algorithm (as
    the written cases are), so that a target meets its normaliser's range and the non-finite policy in every
    format it runs."""
    out: list[Case] = []
    for kind in RANGE_GRADIENTS:
        if any(c.grad == kind for c in rows):
            continue
        formats: set[tuple[str, str, str]] = set()
        for case in rows:
            form = (case.param_dtype, case.compute_dtype, case.orthogonalizer)
            if case.world_size > 1 or form in formats or algorithms.entry(case.optimizer).elementwise:
                continue
            for changes in ({"megabatch": 2, "steps": 2}, {}):
                try:
                    candidate = dataclasses.replace(case, grad=kind, **changes)
                except ValueError:  # the case admits no such gradient (a 1-D parameter's)
                    break
                if supports(candidate) is None:
                    out.append(candidate)
                    formats.add(form)
                    break
    return out


DEFAULTS_LAYERS = {False: ("linear", "conv2d"), True: ("bias", "embedding")}
"""The layers of a matrix algorithm's defaults cases (a matrix, and a convolution under the default
`flatten`), and of an elementwise one's (keyed by `elementwise`)."""


def defaults_rows(target: Target, supports: Callable[[Case], str | None]) -> list[Case]:
    """For each algorithm whose defaults `target` declares (`Target.defaults`): a megabatch of two over three
    steps of Gaussian gradients on each of DEFAULTS_LAYERS, fp32 (unless the declaration fixes the formats),
    holding the declared values, built from them (`construct` "defaults"), where `supports` accepts it. A
    declaration that no valid case can hold is bad input: ValueError naming the target and algorithm."""
    out: list[Case] = []
    for name in algorithms.names():
        declared = target.defaults(name)
        if declared is None:
            continue
        entry = algorithms.entry(name)
        for layer in DEFAULTS_LAYERS[entry.elementwise]:
            base = dict(layer=layer, megabatch=2, flatten=False, param_dtype="fp32", compute_dtype="fp32",
                        orthogonalizer=NO_ORTHOGONALIZER if entry.elementwise else "polar_express",
                        adjust_lr="none" if entry.elementwise else "spectral_norm", nesterov=False, weight_decay=0.0,
                        steps=3, grad="gaussian", optimizer=name, construct="defaults")
            try:
                case = Case(**{**base, **declared})
            except (TypeError, ValueError) as exc:
                raise ValueError(f"target {target.name}: its declared {name} defaults {dict(declared)} make no "
                                 f"valid case ({exc})") from None
            if supports(case) is None:
                out.append(case)
    return out


def select(tier_name: str, patterns: list[str]) -> list[Case]:
    """Cases of the global tier `tier_name` matching any of `patterns` (all if none): `narrow`."""
    return narrow(tier(tier_name), patterns)


def narrow(cases: Iterable[Case], patterns: list[str]) -> list[Case]:
    """`cases` matching any of `patterns` (all if none), in order.

    A pattern that is a complete case id selects exactly that case, even outside `cases`, so
    every id in any report reproduces on its own (and "dion2-..." does not also select the
    "nordion2-..." case it is a substring of); any other pattern selects the ids containing it.
    """
    cases = list(cases)
    if not patterns:
        return cases
    exact: dict[str, Case] = {}
    pieces = []
    for p in patterns:
        try:
            exact[Case.from_id(p).id] = Case.from_id(p)
        except ValueError:
            pieces.append(p)
    chosen = [c for c in cases if c.id in exact or any(p in c.id for p in pieces)]
    known = {c.id for c in chosen}
    return chosen + [c for i, c in exact.items() if i not in known]


def nearest(pattern: str, ids: Iterable[str], n: int = 3) -> list[str]:
    """Up to `n` pieces of `ids` closest to `pattern` (difflib), each as many '/'-separated parts
    long as `pattern`, so that every suggestion is itself a --select that matches."""
    parts = pattern.count("/") + 1
    pieces = set()
    for case_id in ids:
        segments = case_id.split("/")
        pieces.update("/".join(segments[i:i + parts]) for i in range(len(segments) - parts + 1))
    return difflib.get_close_matches(pattern, sorted(pieces), n=n, cutoff=0.6)
