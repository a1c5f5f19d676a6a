"""How much a run judged, said in every verdict: the scope line, and the rule for a run too thin to mean
anything.

  scope  "judged N cases (K checks) of the M this target supports in its ci tier; X of the global tier's
         cases unsupported", N the cases with at least one check that passed, failed or errored (a case
         every check of which was skipped or unsupported judged nothing), K those checks, M the target's
         own tier (harness/running/selection.py), X the cases of the global tier its adapter refused.
  thin   a whole tier (no --select) that judged fewer than MIN_JUDGED cases (or, for a global tier smaller
         than that, such as the gpu tier's, fewer than all of it), or in which some axis value of
         the cases the run's backends accept was judged on no case (every case with that value skipped): the
         verdict says so, and `python -m harness run` exits 1 unless --allow-thin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from cases import Case, tier
from cases.space import AXES, values_of
from harness.running.backends import get as backend
from harness.running.selection import TargetTier
from reports import Record

MIN_JUDGED = 20
"""Fewer judged cases than this is too few to stand for a target's tier: a covering array of even the
narrowest Muon (one algorithm, schedule, compute format and lr scale) holds more."""

JUDGING = ("pass", "fail", "error")
"""The statuses of a check that judged something."""


@dataclass(frozen=True)
class Judgement:
    scope: str
    thin: str


def judgement(own: TargetTier, cases: Sequence[Case], records: Sequence[Record], backends: Sequence[str],
              selected: bool) -> Judgement:
    """The scope line and the thin verdict ("" when not thin) of a run of `cases` (of `own`'s tier, narrowed
    when `selected`) on `backends`, from its records."""
    accepted = [c for c in cases if any(backend(b).accepts(c) for b in backends)]
    judging = {r.case_id for r in records if r.status in JUDGING}
    judged = [c for c in accepted if c.id in judging]
    checks = sum(r.status in JUDGING for r in records)
    scope = (f"judged {len(judged)} cases ({checks} checks) of the {len(own.cases)} this target supports in its "
             f"{own.name} tier; {own.unsupported} of the global {own.name} tier's cases unsupported")
    if selected:
        scope += f"; --select chose {len(cases)}"
    if len(accepted) < len(cases):
        scope += f"; {len(cases) - len(accepted)} not for backend {','.join(backends)}"
    if selected:
        return Judgement(scope, "")
    reasons = []
    least = min(MIN_JUDGED, len(tier(own.name)))
    if len(judged) < least:
        reasons.append(f"{len(judged)} cases judged, fewer than {least}")
    offered, seen = (set(), set()) if not accepted else (_values(accepted), _values(judged))
    missing = sorted(offered - seen, key=str)
    if missing:
        shown = ", ".join(f"{a}={v}" for a, v in missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        reasons.append(f"supported values judged on no case: {shown}")
    return Judgement(scope, "; ".join(reasons))


def _values(cases: Sequence[Case]) -> set[tuple[str, object]]:
    return {(a, v) for c in cases for a, v in zip(AXES, values_of(c))}
