"""What the bf16-robust statistics (harness/judging/robust_checks.py) are judged against: the measured
noise of correct bf16 implementations, per key, and its allowance.

Two tables (harness/policy/tables.py), both written by harness/policy/calibrate/:
  bf16_noise.json        kind "noise": per noise key (keys.noise_key: algorithm, dtypes, the case's
                         orthogonalizer and the schedule the target declares, gradient kind; the layer
                         and view of a one-row layer) the worst
                         |statistic| of the panel (norm, decay, sv_mean, sv_spread, row_spread), over the
                         layers its "conditions" name
  bf16_drift_noise.json  kind "drift": per drift key (keys.drift_key: the noise key, layer and matrix view)
                         the worst |drift| of the panel, at the trajectory length factor its "conditions" name
A statistic's allowance is the safety rule of its table's kind (harness/policy/allowance.py) applied to
that worst; NOISE_CEILING (harness/policy/ill_posed.py) says where an allowance is too wide to judge.
"""

from __future__ import annotations

from dataclasses import dataclass

from cases import Case
from harness.policy import allowance, tables
from harness.policy.keys import Key, drift_key, noise_key
from oracles import Orthogonalizer

NOISE_TABLE = "bf16_noise.json"
DRIFT_TABLE = "bf16_drift_noise.json"


@dataclass(frozen=True)
class Noise:
    """The measured noise one robust check is judged against: the key, its kind's table, the worst
    |statistic| per statistic, and the panel that measured it."""

    key: Key
    kind: str
    worst: dict[str, float]
    table: str
    panel: tuple[str, ...]
    note: str = ""

    def allowed(self, stat: str) -> float:
        return allowance.allowance(self.kind, self.worst[stat])

    def source(self, stat: str) -> str:
        return (f"bf16 noise {self.key}: {allowance.describe(self.kind)} |{stat}| of the panel "
                f"({', '.join(self.panel)}) in the measurement ({self.worst[stat]:.3g}; {self.table}{self.note})")


def _noise_table() -> tables.Table:
    table = tables.load(NOISE_TABLE)
    if table is None:
        raise FileNotFoundError(f"harness/policy/data/{NOISE_TABLE} is missing")
    return table


def covers(case: Case) -> bool:
    """Whether the noise table measured `case`'s layer and algorithm."""
    table = _noise_table()
    return case.layer in table.conditions["layers"] and case.optimizer in {k.optimizer for k in table.entries}


def _found(table: tables.Table, name: str, key: Key) -> Noise | None:
    looked_up = tables.lookup(table, key)
    if looked_up is None:
        return None
    entry, note = looked_up
    return Noise(key, table.kind, dict(entry.worst), name, table.panel, note)


def of_case(case: Case, compute_dtype: str, declared: Orthogonalizer | None = None) -> Noise | None:
    """The measured noise of `case` run in `compute_dtype` by a target declaring orthogonalizer `declared`
    (default ours'), None if unmeasured; at least that of the algorithm whose every step it can take
    (tables.lookup: a correct Dion2 step can be a Muon step)."""
    return _found(_noise_table(), NOISE_TABLE, noise_key(case, compute_dtype, declared=declared))


def of_drift(case: Case, compute_dtype: str, factor: int) -> Noise | None:
    """The measured drift noise of `case` run in `compute_dtype` over `factor` x its steps, None if unmeasured
    (no table, no entry, or a table measured at another factor)."""
    table = tables.load(DRIFT_TABLE)
    if table is None or table.conditions.get("factor") != factor:
        return None
    return _found(table, DRIFT_TABLE, drift_key(case, compute_dtype))
