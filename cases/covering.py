"""Covering arrays: few rows in which every pair of axis values, and every triple within a
group of interacting axes, appears at least once, under the constraints of valid cases.

A `Space` names its axes (each a tuple of values), its constraints (each a predicate over a
few axes, checked as soon as those axes are assigned) and its groups (strength 3 inside a
group, strength 2 everywhere). `covering_array` builds the rows greedily, one row at a time
(AETG/IPOG family, written here): the row starts from the first still-uncovered tuple, then
every other axis takes the allowed value that covers the most uncovered tuples together with
the values already in the row; ties go to the value used least so far, then to the first.
Everything is ordered, so the same space always gives the same rows (stable case ids).

A tuple is required only if its own values satisfy every constraint among them; constraints
here are between pairs of axes and every consistent partial row completes (asserted), so a
required tuple is one some valid case contains.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable, Mapping

Value = Hashable
Row = dict[str, Value]
Combination = tuple[tuple[str, Value], ...]
"""((axis, value), ...) in the space's axis order: one pair or triple of axis values."""


@dataclass(frozen=True)
class Constraint:
    """`holds(*values of axes)` must be true for a valid case; `why` says which rule it is."""

    axes: tuple[str, ...]
    holds: Callable[..., bool]
    why: str


@dataclass(frozen=True)
class Space:
    """Axes with their values (dict order = generation order), constraints, strength-3 groups."""

    axes: Mapping[str, tuple[Value, ...]]
    constraints: tuple[Constraint, ...] = ()
    groups: tuple[tuple[str, ...], ...] = ()
    order: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", {a: i for i, a in enumerate(self.axes)})
        for c in self.constraints:
            unknown = [a for a in c.axes if a not in self.axes]
            if unknown:
                raise ValueError(f"constraint {c.why!r} names unknown axes {unknown}")
        for g in self.groups:
            if len(g) < 3 or any(a not in self.axes for a in g):
                raise ValueError(f"group {g} must name 3+ axes of the space {tuple(self.axes)}")
        empty = [a for a, values in self.axes.items() if not values]
        if empty:
            raise ValueError(f"axes {empty} have no values")

    def allows(self, row: Mapping[str, Value]) -> bool:
        """False if some constraint whose axes are all assigned in `row` fails."""
        return all(c.holds(*(row[a] for a in c.axes)) for c in self.constraints if all(a in row for a in c.axes))

    def triples_of(self) -> list[tuple[str, str, str]]:
        """The axis triples that must be covered: every 3-subset of every group, once."""
        seen: dict[tuple[str, str, str], None] = {}
        for g in self.groups:
            for t in itertools.combinations(sorted(g, key=self.order.__getitem__), 3):
                seen[t] = None
        return list(seen)

    def combinations(self, axes: tuple[str, ...]) -> Iterable[Combination]:
        """Every allowed combination of values of `axes` (given in axis order)."""
        for values in itertools.product(*(self.axes[a] for a in axes)):
            combo = tuple(zip(axes, values))
            if self.allows(dict(combo)):
                yield combo

    def required(self) -> tuple[list[Combination], list[Combination]]:
        """(pairs, triples) every covering array of this space must contain."""
        pairs = [c for ab in itertools.combinations(self.axes, 2) for c in self.combinations(ab)]
        triples = [c for abc in self.triples_of() for c in self.combinations(abc)]
        return pairs, triples


def _contained(row: Mapping[str, Value], space: Space) -> Iterable[Combination]:
    """Every pair of `row`'s values, and every triple of a group, as combinations."""
    for ab in itertools.combinations(space.axes, 2):
        yield tuple((a, row[a]) for a in ab)
    for abc in space.triples_of():
        yield tuple((a, row[a]) for a in abc)


def _gain(row: Row, axis: str, value: Value, links: list[tuple[str, ...]], uncovered: set[Combination]) -> int:
    """How many uncovered combinations over the axis tuples `links` (each holds `axis`, the others
    are assigned in `row`) `axis=value` would complete."""
    return sum(tuple((a, value if a == axis else row[a]) for a in combo) in uncovered for combo in links)


def covering_array(space: Space) -> list[Row]:
    """Rows (one value per axis, every constraint holding) covering every required combination."""
    pairs, triples = space.required()
    todo = triples + pairs  # triples first: they are the hardest to place
    uncovered = set(todo)
    linked = list(itertools.combinations(space.axes, 2)) + space.triples_of()
    uses: Counter[tuple[str, Value]] = Counter()
    by_size = sorted(space.axes, key=lambda a: (-len(space.axes[a]), space.order[a]))
    rows: list[Row] = []
    cursor = 0
    while uncovered:
        while todo[cursor] not in uncovered:
            cursor += 1
        row: Row = dict(todo[cursor])
        for axis in by_size:
            if axis in row:
                continue
            candidates = [v for v in space.axes[axis] if space.allows({**row, axis: v})]
            if not candidates:
                raise AssertionError(f"covering: no value of {axis!r} completes {row}: the constraints "
                                     f"allow a partial row that no valid case contains")
            links = [c for c in linked if axis in c and all(a in row for a in c if a != axis)]
            row[axis] = max(candidates, key=lambda v: (_gain(row, axis, v, links, uncovered), -uses[(axis, v)]))
        full = {a: row[a] for a in space.axes}
        uncovered.difference_update(_contained(full, space))
        uses.update(full.items())
        rows.append(full)
    return rows


@dataclass(frozen=True)
class Coverage:
    """How many of the required pairs and triples some row contains."""

    pairs: int
    pairs_possible: int
    triples: int
    triples_possible: int

    @property
    def complete(self) -> bool:
        return self.pairs == self.pairs_possible and self.triples == self.triples_possible


def coverage(rows: Iterable[Mapping[str, Value]], space: Space) -> Coverage:
    """Count the required combinations of `space` that `rows` contain (rows outside the space,
    e.g. with a value the space lacks, simply cover nothing new)."""
    pairs, triples = space.required()
    seen: set[Combination] = set()
    for row in rows:
        if all(a in row for a in space.axes):
            seen.update(_contained(row, space))
    return Coverage(sum(p in seen for p in pairs), len(pairs), sum(t in seen for t in triples), len(triples))
