"""Pictures' data for the worst reference checks of a run, recomputed on demand.

A case is deterministic, so rather than carry arrays through the run, the report
step reruns the few worst cases (milliseconds each) and keeps, for the worst member
and step: the elementwise error of the update in the flattened [out, prod(rest)]
view, and the singular values of the judged and the reference update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cases import Case
from harness.checks import reference_steps
from harness.inputs import make_inputs
from harness.targets.base import Target
from reports import Record, worst_first
from oracles import singular_values


@dataclass(frozen=True)
class Detail:
    case_id: str
    check: str
    where: str
    error: np.ndarray
    sv_judged: np.ndarray
    sv_reference: np.ndarray


def detail(case: Case, target: Target) -> Detail:
    """Rerun `case` on `target` (one process) and keep the worst step's pictures' data."""
    inputs = make_inputs(case)
    trajectory = target.run(inputs.params, inputs.grads, case)
    worst = max(reference_steps(case, target, inputs.params, inputs.grads, trajectory),
                key=lambda s: float(np.linalg.norm(s[2] - s[3])))
    where, x_prev, x_new, x_ref = worst
    judged, reference = (x_new - x_prev).reshape(case.shape[0], -1), (x_ref - x_prev).reshape(case.shape[0], -1)
    return Detail(case.id, "reference", where, judged - reference, singular_values(judged), singular_values(reference))


def worst_details(records: list[Record], target: Target, limit: int = 8) -> list[Detail]:
    """Details of the `limit` worst reference checks that ran (finite ratio), worst first."""
    chosen = [r for r in worst_first(records) if r.check == "reference" and r.status in ("pass", "fail")
              and math.isfinite(r.ratio)][:limit]
    return [detail(Case.from_id(r.case_id), target) for r in chosen]
