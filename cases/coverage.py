"""How much of each tier's covering-array spaces a list of cases covers (`harness list --coverage`).

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


def tier_coverage(name: str, cases: list[Case] | None = None) -> dict[str, tuple[int, Coverage]]:
    """Per space of tier `name`: (how many of `cases` lie in it, their coverage); `cases` defaults
    to the tier's own."""
    rows = [row_of(c) for c in (tier(name) if cases is None else cases)]
    out = {}
    for space_name, space in SPACES[name].items():
        inside = [r for r in rows if all(r[a] in values for a, values in space.axes.items())]
        out[space_name] = (len(inside), coverage(inside, space))
    return out


def summary(cases: list[Case] | None = None) -> str:
    """One line per space: cases, pairs and triples covered of how many possible. Without `cases`,
    every tier's own coverage; with them (`harness list --coverage`), the coverage of those cases
    against the spaces of the CI tier when they all belong to it, else of the nightly tier."""
    if cases is None:
        per_tier = {name: tier_coverage(name) for name in SPACES}
    else:
        name = "ci" if {c.id for c in cases} <= {c.id for c in tier("ci")} else "nightly"
        per_tier = {name: tier_coverage(name, cases)}
    lines = []
    for name, spaces in per_tier.items():
        for space_name, (n, cov) in spaces.items():
            lines.append(f"{name:8} {space_name:15} {n:5} cases  pairs {cov.pairs}/{cov.pairs_possible}  "
                         f"triples {cov.triples}/{cov.triples_possible}"
                         + ("" if cov.complete else "  INCOMPLETE"))
    return "\n".join(lines)
