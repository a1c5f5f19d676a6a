"""A diagnosis per failing case: the likely kind of bug, read from which checks failed and from
the structure of the error, so that the reader of a report need not infer it.

Rules, first match wins (each names its evidence in the line it writes):

  members-mixed       megabatch fails, equiv2d does not: a member's step depends on the others
  flattened-geometry  equiv2d fails: [out, *rest] does not step as [out, prod(rest)] (lr-scale
                      instead when one constant factor explains the error: fans from the wrong dims)
  replicas            replicas fail: ranks applied different updates
  shard-local         local_shard or layout fails while the single-process reference holds:
                      something is computed per shard (orthogonalization, padding, ownership)
  non-finite          finite fails: a degenerate gradient gives NaN/inf (a 0/0 in a normaliser)
  normaliser-eps      scale fails alone (the step changes when gradients are scaled by 2^10), or
                      the bf16 scale relation (rescale) fails, or
                      reference fails while scale holds, or the error shrinks by more than
                      EPS_SHRINK when the gradients grow 2^10 (both checks' errors, or the case
                      rerun at scale: an error that vanishes at scale is the normaliser's eps)
  weight-decay        the decay relation (probe) fails, or the error lies along the parameter
                      (projection): decay missing, coupled, after the update or with the adjusted lr
  lr-scale            the step is the reference's times one constant (>= 1% off), or each step
                      its own factor (some >= 1% off): the update's size set wrong
  per-row-state       rescaling each output row by its own factor explains the error, or (bf16) the
                      rows check fails: the rows' norms spread against the reference's (NorMuon's
                      row statistics)
  momentum            the first step is within its tolerance and the error grows over the later ones
  orthogonalizer      none of the above: the orthogonalized matrix itself differs (coefficients,
                      normaliser, iteration count), its singular values against f(sigma) say how

With bf16 involved, what a model leaves of the error is counted beyond a correct run's own error
(ours', in quadrature): rounding noise is no part of any defect's structure.

The structural rules rerun the case on the target (as drawn and with gradients x 2^10) (single-process cases only; ms) and
look at the error of every step against the FP64 reference (harness.judging.checks.reference_steps).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from cases import Case
from harness.judging import robust_checks
from harness.judging.checks import SCALE_FACTOR, policy, reference_steps
from harness.judging.metrics import compare_step
from harness.policy import tolerance
from harness.running.inputs import Inputs, make_inputs
from harness.targets.base import Target
from reports import Record

LABELS = ("members-mixed", "flattened-geometry", "replicas", "shard-local", "non-finite", "normaliser-eps",
          "weight-decay", "lr-scale", "momentum", "per-row-state", "orthogonalizer")

SCALE_OFF = 0.01
"""A constant factor farther than this from 1 counts as an lr-scale error."""
EXPLAINED = 0.25
"""A model of the error 'explains' it when it leaves less than this fraction of the error's norm."""
EPS_SHRINK = 32.0
"""An error whose relative size falls by more than this factor when the gradients grow 2^10 comes
from an additive constant in the normaliser (its eps); scale-invariant defects keep their size."""


@dataclasses.dataclass(frozen=True)
class Structure:
    """Of the target's steps against the reference's, over every member and step.

    errors[k]: relative error of step k (worst member); first_ok: every member's first step within
    its reference tolerance (None where the policy has no entry); factor: least-squares c in dX ~ c dref;
    factor_left: relative error left after that fit; along_param: |<err, x>| / (||err|| ||x||);
    row_left: error left after fitting one factor per output row, relative to the error;
    step_factors, step_left: the least-squares factor of each member's each step, and the error
    left after fitting them, relative to the error;
    shrink: the relative error over the run / the same with gradients x 2^10 (scale invariance
    leaves it ~1; a normaliser's additive eps makes it large)."""

    errors: list[float]
    first_ok: bool | None
    factor: float
    factor_left: float
    along_param: float
    row_left: float
    step_factors: list[float]
    step_left: float
    shrink: float
    error: float = 0.0
    """||err|| / ||dref|| over the run."""
    noise: float = 0.0
    """The same of ours on the case where bf16 is involved (a correct run's own error), else 0."""

    def beyond_noise(self, left: float) -> float:
        """`left` (a fraction of the error a model leaves) less, in quadrature, the fraction a correct
        run's own error accounts for: bf16 noise is no part of any model of a defect."""
        if not (self.noise and self.error):
            return left
        return math.sqrt(max(0.0, left**2 - min(1.0, self.noise / self.error) ** 2))


def structure(case: Case, target: Target) -> Structure:
    """Rerun `case` on `target` and measure the error's structure."""
    inputs = make_inputs(case)
    traj = target.run(inputs.params, inputs.grads, case)
    try:
        pol = policy(case, target, inputs)
    except tolerance.NoEntry:
        pol = None
    first_ok = None if pol is None else True
    per_step: dict[int, float] = {}
    num = den = 0.0
    err_sq = left_sq = row_left_sq = step_left_sq = 0.0
    along, step_factors = [], []
    for where, x_prev, x_new, x_ref in reference_steps(case, target, inputs.params, inputs.grads, traj):
        k = int(where.rsplit(" ", 1)[1]) - 1
        if k == 0 and pol is not None:
            tol = pol.at(int(where.split()[1]), 0)
            first_ok = first_ok and compare_step(x_prev, x_new, x_ref, case.param_dtype, tol.rtol,
                                                 tol.storage_ulps).ratio <= 1.0
        step, ref = x_new - x_prev, x_ref - x_prev
        err = step - ref
        ref_norm, err_norm = float(np.linalg.norm(ref)), float(np.linalg.norm(err))
        per_step[k] = max(per_step.get(k, 0.0), err_norm / ref_norm if ref_norm else (math.inf if err_norm else 0.0))
        num += float(np.vdot(step, ref))
        den += float(np.vdot(ref, ref))
        if ref_norm:
            c_step = float(np.vdot(step, ref)) / ref_norm**2
            step_factors.append(c_step)
            step_left_sq += float(np.sum((step - c_step * ref) ** 2))
        err_sq += err_norm**2
        x_norm = float(np.linalg.norm(x_prev))
        if err_norm and x_norm:
            along.append(abs(float(np.vdot(err, x_prev))) / (err_norm * x_norm))
        rows_s, rows_r = step.reshape(case.shape[0], -1), ref.reshape(case.shape[0], -1)
        rr = np.einsum("ij,ij->i", rows_r, rows_r)
        c = np.where(rr > 0, np.einsum("ij,ij->i", rows_s, rows_r) / np.where(rr > 0, rr, 1.0), 0.0)
        row_left_sq += float(np.sum((rows_s - c[:, None] * rows_r) ** 2))
    factor = num / den if den else math.nan
    for _, x_prev, x_new, x_ref in reference_steps(case, target, inputs.params, inputs.grads, traj):
        left_sq += float(np.sum(((x_new - x_prev) - factor * (x_ref - x_prev)) ** 2))
    err_total = math.sqrt(err_sq)
    rel = err_total / math.sqrt(den) if den else math.inf
    scaled = _relative_error(case, target, inputs.scaled(SCALE_FACTOR))
    noise = 0.0
    if "bf16" in (case.param_dtype, case.compute_dtype):
        from harness.targets import (
            load_target,  # the targets import the runner, which imports this module
        )
        noise = _relative_error(case, load_target("ours"), inputs)
    return Structure(errors=[per_step[k] for k in sorted(per_step)], first_ok=first_ok, factor=factor,
                     factor_left=math.sqrt(left_sq) / err_total if err_total else 0.0,
                     along_param=float(np.mean(along)) if along else 0.0,
                     row_left=math.sqrt(row_left_sq) / err_total if err_total else 0.0,
                     step_factors=step_factors, step_left=math.sqrt(step_left_sq) / err_total if err_total else 0.0,
                     shrink=rel / scaled if scaled else (math.inf if rel else 1.0), error=rel, noise=noise)


def _relative_error(case: Case, target: Target, inputs: Inputs) -> float:
    """||err|| / ||dref|| over every step and member of `target`'s run of `inputs`."""
    traj = target.run(inputs.params, inputs.grads, case)
    err_sq = ref_sq = 0.0
    for _, x_prev, x_new, x_ref in reference_steps(case, target, inputs.params, inputs.grads, traj):
        err_sq += float(np.sum(((x_new - x_prev) - (x_ref - x_prev)) ** 2))
        ref_sq += float(np.sum((x_ref - x_prev) ** 2))
    return math.sqrt(err_sq / ref_sq) if ref_sq else math.inf


def _by_check(records: list[Record]) -> dict[str, Record]:
    return {r.check: r for r in records}


def _failed(checks: dict[str, Record], name: str) -> bool:
    return name in checks and checks[name].failing


def _held(checks: dict[str, Record], name: str) -> bool:
    return name in checks and checks[name].status == "pass"


def _from_pattern(checks: dict[str, Record]) -> str | None:
    """A diagnosis from which checks failed alone, or None."""
    if _failed(checks, "megabatch") and not _failed(checks, "equiv2d"):
        return "members-mixed: megabatch fails while equiv2d holds; a member's step depends on the other members"
    if _failed(checks, "equiv2d"):
        return "flattened-geometry: equiv2d fails; [out, *rest] does not step as [out, prod(rest)]"
    if _failed(checks, "replicas"):
        return "replicas: ranks hold different parameters after the step"
    if (_failed(checks, "local_shard") or _failed(checks, "layout")) and "reference" in checks:
        return ("shard-local: the distributed step differs from the same-sharding reference or from the "
                "single-process run; something is computed per shard")
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


def _from_robust(checks: dict[str, Record]) -> str | None:
    """A diagnosis from the bf16-robust checks (their messages start with the worst statistic), or None."""
    spectrum, norm, probe = checks.get("spectrum"), checks.get("norm"), checks.get("probe")
    rows = checks.get("rows")
    if probe is not None and probe.failing:
        return f"weight-decay: the decay relation fails ({probe.message})"
    rescale = checks.get("rescale")
    if rescale is not None and rescale.failing:
        return (f"normaliser-eps: the run with gradients x 2^10 does not repeat the run without, where the "
                f"declared eps cannot tell them apart ({rescale.message})")
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


def _from_structure(case: Case, s: Structure) -> str:
    errors = ", ".join(f"{e:.2g}" for e in s.errors)
    if s.shrink > EPS_SHRINK:
        return (f"normaliser-eps: the error shrinks {s.shrink:.3g}x when the gradients grow 2^10; an error "
                f"that vanishes at scale is the normaliser's eps")
    if s.along_param > 0.5:
        return f"weight-decay: the error lies along the parameter (|cos| {s.along_param:.2f}); errors per step {errors}"
    decay = case.lr * case.weight_decay
    if s.factor_left < EXPLAINED and decay > 0 and abs(s.factor - (1.0 - decay)) < 0.1 * decay:
        return (f"weight-decay: the step is (1 - lr wd) = {s.factor:.6g} x the reference's: decay applied "
                f"after the update")
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
    if len(s.errors) > 1 and s.first_ok is not False and s.errors[0] < 0.25 * max(s.errors[1:]):
        return f"momentum: step 1 is within its tolerance, the error grows over the steps ({errors})"
    return f"orthogonalizer: the orthogonalized update itself differs (errors per step {errors})"


def diagnose(case: Case, target: Target, records: list[Record]) -> str:
    """One line: the likely kind of bug behind the failing checks of `case` ("" if none failed)."""
    if not any(r.failing for r in records):
        return ""
    checks = _by_check(records)
    if all(r.status == "error" for r in records if r.failing):
        return "error: the target raised (see the message)"
    found = _from_pattern(checks)
    if found and label(found) == "flattened-geometry" and case.layout == "single":
        try:
            scaled = _constant_factor(structure(case, target))
        except Exception:  # the pattern's diagnosis stands
            scaled = None
        found = f"{scaled} (equiv2d fails too: the lr fans come from the unflattened shape)" if scaled else found
    if found:
        return found
    if case.layout != "single":
        return "orthogonalizer: the distributed reference fails, no relation singles out a cause"
    if not _failed(checks, "reference"):
        found = _from_robust(checks)
        if found:
            return found
    try:
        return _from_structure(case, structure(case, target))
    except Exception as exc:  # a diagnosis never hides the verdict it explains
        return f"undiagnosed: rerunning the case raised {type(exc).__name__}: {exc}"


def annotate(case: Case, target: Target, records: list[Record]) -> list[Record]:
    """`records` with the case's diagnosis on every failing record."""
    line = diagnose(case, target, records)
    if not line:
        return records
    return [dataclasses.replace(r, diagnosis=line) if r.failing else r for r in records]


def label(diagnosis: str) -> str:
    """The rule label a diagnosis line starts with."""
    return diagnosis.split(":", 1)[0]
