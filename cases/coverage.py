"""How much of each tier's covering-array space the tier's cases cover (`harness list --coverage`).

Counted on the cases the tier really holds, not on the generator's rows, so a change to a
tier that opens a hole shows here as covered < possible.
"""

from __future__ import annotations

import dataclasses

from cases.case import Case
from cases.covering import Coverage, coverage
from cases.tiers import SPACES, tier


def row_of(case: Case) -> dict[str, object]:
    """A case as a covering-array row: its fields and its layer kind."""
    return {**dataclasses.asdict(case), "kind": case.kind}


def tier_coverage(name: str) -> dict[str, tuple[int, Coverage]]:
    """Per space of tier `name`: (its cases in the tier, the coverage of the tier's cases)."""
    rows = [row_of(c) for c in tier(name)]
    out = {}
    for space_name, space in SPACES[name].items():
        inside = [r for r in rows if all(r[a] in values for a, values in space.axes.items())]
        out[space_name] = (len(inside), coverage(inside, space))
    return out


def summary() -> str:
    """One line per tier and space: cases, pairs and triples covered of how many possible."""
    lines = []
    for name in SPACES:
        for space_name, (n, cov) in tier_coverage(name).items():
            lines.append(f"{name:8} {space_name:15} {n:5} cases  pairs {cov.pairs}/{cov.pairs_possible}  "
                         f"triples {cov.triples}/{cov.triples_possible}"
                         + ("" if cov.complete else "  INCOMPLETE"))
    return "\n".join(lines)
