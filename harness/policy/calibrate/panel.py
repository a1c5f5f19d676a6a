"""Who a calibration measures: ours and the independent members of harness/targets/panel, each on the cases
it runs and is not known wrong on. A statistical allowance is the panel's worst (harness/policy/allowance.py),
so a correct implementation that rounds differently from ours is not failed.

A peer's declared schedule (harness/policy/keys.py SCHEDULES) runs on panel members declaring it, ours and
the plain ones, never on the peer: the peer is what gets judged.
"""

from __future__ import annotations

import dataclasses

from cases import Case, tier
from harness.policy.calibrate.variants import DeclaredCompute, DeclaredSchedule
from harness.running.selection import target_tier
from harness.targets import load_target
from harness.targets.base import Target
from harness.targets.panel import PANEL
from harness.targets.panel.plain import Plain

OURS = "ours"
MEMBERS: tuple[str, ...] = (OURS, *(m.spec for m in PANEL))
"""Every implementation a calibration may measure, by target spec."""


def build(member: str, schedule: str | None = None, eps: float | None = None) -> Target | None:
    """Panel member `member` running `schedule` with normaliser `eps` where given (None: its own), or None where
    it cannot declare a schedule (torch.optim.Muon runs Keller Jordan's quintic only)."""
    if member not in MEMBERS:
        raise ValueError(f"unknown panel member {member!r}; expected one of {MEMBERS}")
    if schedule is None and eps is None:
        return load_target(member)
    if member == OURS:
        return DeclaredSchedule(schedule, eps) if schedule else None
    target = load_target(member)
    if not isinstance(target, Plain):
        return None
    return Plain(target.form, target.state, schedule, eps)


def runs_case(member: str, target: Target, case: Case) -> bool:
    """Whether `target` (panel member `member`) runs `case` and is not known wrong on it; a duplicate is left
    out: a plain member keeping its momentum in "at least fp32" runs what its parameter-dtype twin runs except
    on bf16 parameters."""
    if target.unsupported(case) is not None:
        return False
    known = next((m.known for m in PANEL if m.spec == member), None)
    if known is not None and known(case) is not None:
        return False
    return not (isinstance(target, Plain) and target.state == "fp32" and case.param_dtype != "bf16")


def own_cases(member: str, tier_name: str) -> list[Case]:
    """The single-process cases member `member` is judged on beyond the global tier `tier_name`'s: the
    covering rows its own tier adds (harness/running/selection.py). A narrow member runs cases the global
    tier lacks, and an allowance must hold on every case a member is judged on, not only on the shared ones."""
    shared = set(map(single, tier(tier_name)))
    own = target_tier(tier_name, load_target(member)).cases
    return [c for c in dict.fromkeys(map(single, own)) if c not in shared]


def label(member: str, target: Target) -> str:
    """How a measured run differs from our Muon on its case ("" for ours): its schedule, compute, member."""
    schedule = getattr(target, "schedule", None)
    return ((f" with schedule {schedule}" if schedule else "")
            + (f" computed in {target.compute}" if isinstance(target, DeclaredCompute) else "")
            + ("" if member == OURS else f" by {member}"))


def single(case: Case) -> Case:
    """The single-process case a distributed one is judged like: its owner orthogonalizes whole matrices."""
    return dataclasses.replace(case, layout="single", world_size=1, scope=None)
