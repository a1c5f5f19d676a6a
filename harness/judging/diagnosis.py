"""A diagnosis per failing case: the likely kind of bug, read from which checks failed and from the structure
of the error of what they judged, so that the reader of a report need not infer it.

Made from what judging the case left (harness/judging/judged.py): its records, the trajectory every check
judged, the runs the checks made (gradients x 2^10, the [out, prod(rest)] view) and the tolerance policy's
measurements, under the conventions the target declares. It never runs a target.

Rules, first match wins (each names its evidence in the line it writes):

  error               every failing check is an error: the target raised
  non-finite          nonfinite fails: a NaN gradient element is not handled as the documented policy says
  members-mixed       megabatch fails, equiv2d does not: a member's step depends on the others; or mixed
                      fails, equiv2d and reference do not: a parameter's step depends on the other layer kind in
                      its group (flattened-geometry where only a Linear case's twin convolutions fail)
  replicas            replicas fail: ranks applied different updates
  selection           a selecting algorithm (Dion2, NorDion2), its selection well posed: the judged update
                      moves slices the reference's top-k leaves out, or leaves selected ones unmoved (wrong
                      slices, wrong side, the local scope where global is declared, state of the wrong slices)
  flattened-geometry  equiv2d fails: [out, *rest] does not step as [out, prod(rest)] (lr-scale instead when
                      one factor relates the two runs' orthogonalized parts: fans from the unflattened shape)
  shard-local         layout fails: the distributed step differs from the target's single-process step
  non-finite          finite fails: a degenerate gradient gives NaN/inf (a 0/0 in a normaliser)
  normaliser-eps      scale fails alone, or reference fails while scale holds, or both fail and the error
                      shrinks by more than EPS_SHRINK at gradients x 2^10
  the bf16-robust checks, where reference holds: probe (weight-decay), rescale (normaliser-eps; momentum where
                      the scaled run repeats the first step and not a later one), rows (per-row-state),
                      spectrum (orthogonalizer), norm (weight-decay along the parameter, else lr-scale),
                      drift (momentum)
  then the structure of the error (harness/judging/structure.py), single-process or gathered over a layout
  (a failing local_shard alone is no evidence of sharding: a piece of a wrong step is wrong):
  normaliser-eps      the error shrinks by more than EPS_SHRINK in the run with gradients x 2^10
  shard-local         a distributed megabatch whose members' steps are other members' reference steps (the
                      exchange hands updates to the wrong members; members-mixed in one process)
  weight-decay        the error lies along the parameter, or the step is (1 - lr wd) x the reference's
  the judged steps under SCALE_OFF x the reference's (every factor model fits them): shard-local on several
                      ranks (the exchange lost the update), normaliser-eps under tiny, huge or extreme
                      gradients (a scale-invariant step keeps its size), else orthogonalizer
  lr-scale            the step is the reference's times one constant (>= 1% off), or each step its own factor
  per-row-state       one factor per output row explains the error (NorMuon's row statistics)
  flattened-geometry  one factor per row of the unflattened kernel's trailing slices explains it (statistics
                      of the kernel slices where the flattened matrix is declared)
  shard-local         a case sharded along one dim: each rank's piece is the orthogonalization of its own piece
                      of the direction, up to one factor per row
  momentum            the first step is within its tolerance and the error grows over the later ones
  orthogonalizer      none of the above: the orthogonalized matrix itself differs

A model "explains" the error when it leaves less than EXPLAINED of it beyond what a correct run's own
error accounts for (the tolerance policy's measured coefficient: rounding is no part of a defect's model).
"""

from __future__ import annotations

import dataclasses
import math

from cases import Case
from cases.axes import EXTREME_GRADIENT
from harness.algorithms import algorithm
from harness.judging import robust_checks
from harness.judging.checks import MEMBERS_HOLD
from harness.judging.judged import Judged
from harness.judging.structure import Declared, Structure, related, scale_relation, structure
from harness.targets.base import Target
from reports import Record

LABELS = ("error", "members-mixed", "replicas", "selection", "flattened-geometry", "shard-local", "non-finite",
          "normaliser-eps", "weight-decay", "lr-scale", "momentum", "per-row-state", "orthogonalizer")

SCALE_OFF = 0.01
"""A constant factor farther than this from 1 counts as an lr-scale error."""
EXPLAINED = 0.25
"""A model of the error 'explains' it when it leaves less than this fraction of the error's norm."""
OFF_SCALE_GRADIENTS = ("tiny", "huge", EXTREME_GRADIENT)
"""The gradient kinds far from unit scale (cases/data.py), where a step that is not scale invariant shows."""
EPS_SHRINK = 32.0
"""An error whose relative size falls by more than this factor when the gradients grow 2^10 comes
from an additive constant in the normaliser (its eps); scale-invariant defects keep their size."""


def _by_check(records: list[Record]) -> dict[str, Record]:
    return {r.check: r for r in records}


def _failed(checks: dict[str, Record], name: str) -> bool:
    return name in checks and checks[name].failing


def _held(checks: dict[str, Record], name: str) -> bool:
    return name in checks and checks[name].status == "pass"


def _from_pattern(checks: dict[str, Record]) -> str | None:
    """A diagnosis from which checks failed alone (after members-mixed, replicas and selection), or None."""
    if _failed(checks, "layout"):
        return ("shard-local: the distributed step differs from the target's single-process step; something "
                "is computed per shard")
    if _failed(checks, "finite"):
        return "non-finite: a degenerate gradient leaves NaN/inf in the parameters"
    if _failed(checks, "scale") and _held(checks, "reference"):
        return "normaliser-eps: only the gradients x 2^10 run fails; the normaliser's eps or range"
    if _failed(checks, "reference") and _held(checks, "scale"):
        return ("normaliser-eps: the reference fails while the gradients x 2^10 run holds; an error that "
                "vanishes at scale is the normaliser's eps")
    if _failed(checks, "reference") and _failed(checks, "scale"):
        shrink = checks["reference"].rel_err / checks["scale"].rel_err if checks["scale"].rel_err > 0 else math.inf
        if shrink > EPS_SHRINK:
            return (f"normaliser-eps: the error shrinks {shrink:.3g}x when the gradients grow 2^10; an error "
                    f"that vanishes at scale is the normaliser's eps")
    return None


def _rescaled(case: Case, judged: Judged, message: str) -> str:
    """rescale fails: normaliser-eps, or momentum where the scaled run repeats the first step and not a later
    one (structure.scale_relation)."""
    scaled = judged.runs.get("rescale")
    if scaled is not None and judged.trajectory is not None and case.steps > 1:
        ratios = scale_relation(case, judged.trajectory, scaled)
        if ratios[0] <= 1.0 < max(ratios[1:]):
            return (f"momentum: the run with gradients x 2^10 repeats the first step and not the later ones "
                    f"(relation ratios per step {', '.join(f'{r:.2g}' for r in ratios)}): state carried between "
                    f"steps depends on the gradients' scale ({message})")
    return (f"normaliser-eps: the run with gradients x 2^10 does not repeat the run without, where the "
            f"declared eps cannot tell them apart ({message})")


def _from_robust(case: Case, checks: dict[str, Record], judged: Judged) -> str | None:
    """A diagnosis from the bf16-robust checks (their messages start with the worst statistic), or None."""
    spectrum, norm, probe = checks.get("spectrum"), checks.get("norm"), checks.get("probe")
    rows = checks.get("rows")
    if probe is not None and probe.failing:
        return f"weight-decay: the decay relation fails ({probe.message})"
    rescale = checks.get("rescale")
    if rescale is not None and rescale.failing:
        return _rescaled(case, judged, rescale.message)
    if rows is not None and rows.failing:
        return f"per-row-state: the update's rows are rescaled against the reference's, row by row ({rows.message})"
    if spectrum is not None and spectrum.failing:
        return (f"orthogonalizer: the singular values of the orthogonalized part differ from the oracle's "
                f"f(sigma) ({spectrum.message})")
    if norm is not None and norm.failing:
        if robust_checks.worst_statistic(norm.message) == "decay":
            return f"weight-decay: the error has a component along the parameter ({norm.message})"
        return f"lr-scale: the update's size differs systematically ({norm.message})"
    drift = checks.get("drift")
    if drift is not None and drift.failing:
        return (f"momentum: under a persistent gradient the error of the accumulated displacement grows "
                f"with the steps, where a correct run's stays at its first steps' level: state accumulated "
                f"wrong ({drift.message})")
    return None


def _constant_factor(s: Structure) -> str | None:
    """The lr-scale diagnosis when one constant factor (>= SCALE_OFF from 1) explains the error."""
    if abs(s.factor - 1.0) > SCALE_OFF and s.beyond_noise(s.factor_left) < EXPLAINED:
        return (f"lr-scale: the step is {s.factor:.4g} x the reference's (a constant factor explains "
                f"{1 - s.factor_left:.0%} of the error)")
    return None


def _flattened(case: Case, declared: Declared, judged: Judged) -> str:
    """equiv2d fails: flattened-geometry, or lr-scale where one factor relates the flattened run to its
    [out, prod(rest)] run (the lr fans come from the unflattened shape)."""
    flat = judged.runs.get("equiv2d")
    if flat is not None and judged.trajectory is not None:
        pair = related(case, declared.conventions(case), judged.trajectory, flat)
        if abs(pair.factor - 1.0) > SCALE_OFF and pair.left < EXPLAINED:
            return (f"lr-scale: the flattened run's update is {pair.factor:.4g} x its [out, prod(rest)] run's "
                    f"(one factor explains {1 - pair.left:.0%} of their difference): the lr fans come from the "
                    f"unflattened shape")
    return "flattened-geometry: equiv2d fails; [out, *rest] does not step as [out, prod(rest)]"


def _from_structure(case: Case, s: Structure) -> str:
    errors = ", ".join(f"{e:.2g}" for e in s.errors)
    if s.shrink is not None and s.shrink > EPS_SHRINK:
        return (f"normaliser-eps: the error shrinks {s.shrink:.3g}x when the gradients grow 2^10; an error "
                f"that vanishes at scale is the normaliser's eps")
    if s.swaps and s.swapped is not None and s.swapped < EXPLAINED:
        matched = (f"{s.swaps} member step(s) are another member's reference update (what is left of the error "
                   f"{s.swapped:.0%})")
        if case.world_size > 1:
            return f"shard-local: {matched}: the distributed exchange hands updates to the wrong members"
        return f"members-mixed: {matched}: updates land on the wrong members of the megabatch"
    if s.along_param > 0.5:
        return f"weight-decay: the error lies along the parameter (|cos| {s.along_param:.2f}); errors per step {errors}"
    decay = case.lr * case.weight_decay
    if s.factor_left < EXPLAINED and decay > 0 and abs(s.factor - (1.0 - decay)) < 0.1 * decay:
        return (f"weight-decay: the step is (1 - lr wd) = {s.factor:.6g} x the reference's: decay applied "
                f"after the update")
    if abs(s.factor) < SCALE_OFF:
        return _vanished(case, s.factor)
    scaled = _constant_factor(s)
    if scaled:
        return scaled
    if (s.step_factors and s.beyond_noise(s.step_left) < EXPLAINED
            and max(abs(c - 1.0) for c in s.step_factors) > SCALE_OFF):
        return (f"lr-scale: each step is the reference's times its own factor ({min(s.step_factors):.4g} to "
                f"{max(s.step_factors):.4g}; they explain {1 - s.step_left:.0%} of the error): the update's "
                f"size is set wrong per parameter")
    if s.beyond_noise(s.row_left) < EXPLAINED:
        return (f"per-row-state: one factor per output row explains {1 - s.row_left:.0%} of the error "
                f"(row statistics or row normalisation)")
    if s.kernel_row_left is not None and s.beyond_noise(s.kernel_row_left) < EXPLAINED:
        return (f"flattened-geometry: one factor per row of the unflattened kernel's trailing slices explains "
                f"{1 - s.kernel_row_left:.0%} of the error, one per output row {1 - s.row_left:.0%}: statistics "
                f"of the [..., {case.shape[-2]}, {case.shape[-1]}] slices where the flattened matrix is declared")
    if s.shard_left is not None and s.beyond_noise(s.shard_left) < EXPLAINED:
        return (f"shard-local: each rank's piece of the update is the orthogonalization of its own piece of the "
                f"direction, up to one factor per row (that model leaves {s.shard_left:.0%} of the error): the "
                f"step is computed per shard")
    if len(s.errors) > 1 and s.first_ok is not False and s.errors[0] < 0.25 * max(s.errors[1:]):
        return f"momentum: step 1 is within its tolerance, the error grows over the steps ({errors})"
    return _unexplained(f"errors per step {errors}")


def _vanished(case: Case, factor: float) -> str:
    """The judged steps are under SCALE_OFF x the reference's, so every factor model fits them: a distributed
    step that loses its update (ownership, padding, gather), a step that is not scale invariant at the tiny
    gradients' scale (the normaliser's eps), else no model is named."""
    moved = f"the judged steps are {factor:.2g} x the reference's: the update vanishes"
    if case.world_size > 1:
        return f"shard-local: {moved} on {case.world_size} ranks, where one process's orthogonalized step would not"
    if case.grad in OFF_SCALE_GRADIENTS:
        return (f"normaliser-eps: {moved} under {case.grad} gradients, where a scale-invariant step keeps its size: "
                f"the normaliser's eps or range")
    return _unexplained(f"{moved}, so every factor model fits it and none is named")


def _unexplained(evidence: str) -> str:
    """No model of the error's shape explains it: the orthogonalized update itself differs."""
    return f"orthogonalizer: the orthogonalized update itself differs ({evidence})"


def diagnose(case: Case, declared: Declared, records: list[Record], judged: Judged) -> str:
    """One line: the likely kind of bug behind the failing checks of `case` ("" if none failed), from the
    records and what the checks judged (`judged`), under the conventions the target declares."""
    if not any(r.failing for r in records):
        return ""
    checks = _by_check(records)
    if all(r.status == "error" for r in records if r.failing):
        return "error: the target raised (see the message)"
    try:
        return _diagnose(case, declared, checks, judged)
    except NoTrajectory:
        return "undiagnosed: the checks judged no trajectory, and no check's pattern names a cause"
    except Exception as exc:  # a diagnosis never hides the verdict it explains
        return f"undiagnosed: measuring the error's structure raised {type(exc).__name__}: {exc}"


class NoTrajectory(LookupError):
    """The structure of the error is asked of a case whose checks judged no trajectory."""


def _structure(case: Case, declared: Declared, judged: Judged) -> Structure:
    if judged.trajectory is None:
        raise NoTrajectory(case.id)
    return structure(case, declared, judged)


def _diagnose(case: Case, declared: Declared, checks: dict[str, Record], judged: Judged) -> str:
    if _failed(checks, "nonfinite"):
        return (f"non-finite: a NaN gradient element is not handled as the documented policy says "
                f"({checks['nonfinite'].message})")
    if _failed(checks, "megabatch") and not _failed(checks, "equiv2d"):
        return "members-mixed: megabatch fails while equiv2d holds; a member's step depends on the other members"
    if ("mixed" in checks and checks["mixed"].status == "fail" and not _failed(checks, "equiv2d")
            and not _failed(checks, "reference")):
        if len(case.shape) == 2 and MEMBERS_HOLD in checks["mixed"].message:
            return ("flattened-geometry: mixed fails on the twins alone; in a group led by Linear layers a "
                    "[out, in, 1, 1] convolution does not step as its [out, in] matrix")
        return ("members-mixed: mixed fails while equiv2d holds; a parameter's step depends on the other layer "
                "kind in its group (flatten, megabatching or write-back decided for the group, not per parameter)")
    if _failed(checks, "replicas"):
        return "replicas: ranks hold different parameters after the step"
    s = _structure(case, declared, judged) if algorithm(case).selects else None
    if s is not None and s.selection:
        return (f"selection: the update moves {s.selection} slice(s) (over the members and steps) that the "
                f"reference's top-k selection leaves out, or leaves selected ones unmoved")
    if _failed(checks, "equiv2d"):
        return _flattened(case, declared, judged)
    found = _from_pattern(checks)
    if found:
        return found
    if case.layout == "single" and not _failed(checks, "reference"):
        found = _from_robust(case, checks, judged)
        if found:
            return found
    return _from_structure(case, s or _structure(case, declared, judged))


def annotate(case: Case, target: Target, records: list[Record], judged: Judged) -> list[Record]:
    """`records` with the case's diagnosis on every failing record, made from what the checks judged."""
    line = diagnose(case, Declared.of(target), records, judged)
    if not line:
        return records
    return [dataclasses.replace(r, diagnosis=line) if r.failing else r for r in records]


def label(diagnosis: str) -> str:
    """The rule label a diagnosis line starts with."""
    return diagnosis.split(":", 1)[0]
