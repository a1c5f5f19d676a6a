"""Choosing the cases of a run: a tier, narrowed by --select."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from cases import Case, tier


def select(tier_name: str, patterns: list[str]) -> list[Case]:
    """Cases of `tier_name` matching any of `patterns` (all if none), in tier order.

    A pattern that is a complete case id selects exactly that case, even outside the tier, so
    every id in any report reproduces on its own (and "dion2-..." does not also select the
    "nordion2-..." case it is a substring of); any other pattern selects the ids containing it.
    """
    cases = tier(tier_name)
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
