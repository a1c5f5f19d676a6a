"""Choosing the cases of a run: a tier, narrowed by --select."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from cases import Case, tier


def select(tier_name: str, patterns: list[str]) -> list[Case]:
    """Cases of `tier_name` whose id contains any of `patterns` (all if none).

    A pattern that is a complete case id selects that case even outside the tier,
    so every id in any report reproduces on its own.
    """
    cases = tier(tier_name)
    if not patterns:
        return cases
    chosen = [c for c in cases if any(p in c.id for p in patterns)]
    known = {c.id for c in chosen}
    for p in patterns:
        try:
            case = Case.from_id(p)
        except ValueError:
            continue
        if case.id not in known:
            chosen.append(case)
            known.add(case.id)
    return chosen


def nearest(pattern: str, ids: Iterable[str], n: int = 3) -> list[str]:
    """Up to `n` pieces of `ids` closest to `pattern` (difflib), each as many '/'-separated parts
    long as `pattern`, so that every suggestion is itself a --select that matches."""
    parts = pattern.count("/") + 1
    pieces = set()
    for case_id in ids:
        segments = case_id.split("/")
        pieces.update("/".join(segments[i:i + parts]) for i in range(len(segments) - parts + 1))
    return difflib.get_close_matches(pattern, sorted(pieces), n=n, cutoff=0.6)
