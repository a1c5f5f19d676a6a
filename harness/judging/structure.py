"""The structure of a failing case's error, measured on what its checks judged (harness/judging/judged.py):
every step of the judged trajectory against the FP64 reference step from the target's own previous
parameter (harness.judging.checks.reference_steps), under the conventions the target declares. Nothing here
runs a target: `Declared` stands for it, and running it raises.

err = dX - dref per member and step (dX the judged step, dref the reference's), over the whole run:

  errors        ||err|| / ||dref|| of each step, the worst member
  first_ok      every member's first step within its reference tolerance (None: no policy entry)
  factor        least-squares c in dX ~ c dref; factor_left: ||dX - c dref|| / ||err||
  step_factors  the least-squares factor of each member's each step; step_left: the error left after them
  row_left      the error left after one factor per output row of each step
  kernel_row_left  a flattened 3-D+ parameter whose trailing dim has KERNEL_ROW_MIN entries or more: the error
                left after one factor per row of its unflattened trailing slices (None elsewhere)
  along_param   mean |<err, x>| / (||err|| ||x||) over the steps
  swapped       a megabatch: ||O - O_ref[j]|| / ||O - O_ref|| over the run, where O is each member's judged
                orthogonalized part (orthogonal_part) and O_ref[j] the reference's of the member j whose is
                nearest at that step; swaps: how many (member, step) pairs match another member's best
                (None and 0 for one member)
  shard_left    a case sharded along one dim of a non-selecting algorithm: the error left, relative to the
                error of the orthogonalized parts (O - O_ref), after modelling each rank's piece of O as the
                declared orthogonalization of its own piece of the direction alone (the matrices of that
                piece), one factor per row of its matrices: a step computed per shard (None elsewhere)
  shrink        error / the same of the run with gradients x 2^10 (scale invariance leaves ~1, a normaliser's
                additive eps makes it large); None where no check made that run
  error         ||err|| / ||dref||
  noise         the error a correct run shows on the case, as the tolerance policy measured it
                (correct_error), relative like `error`
  selection     selecting algorithms, a well-posed selection: the slices of the matrix view the judged
                update moves where the reference leaves them, and those the reference moves where it does
                not (moved_slices), counted over every member and step
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np
import torch

from cases import Case
from cases.layouts import regions, shard_dim
from harness.algorithms import algorithm
from harness.judging.checks import SCALE_FACTOR, reference_steps
from harness.judging.judged import Judged
from harness.judging.metrics import compare_step
from harness.judging.outcome import Trajectory
from harness.judging.robust_checks import orthogonal_part
from harness.policy import tolerance
from harness.policy.bounds import RELATION_ULPS, STORAGE_ULPS
from harness.running.inputs import Inputs, f64, make_inputs
from harness.targets.base import Target
from oracles import Conventions, lr_scale, matrix_view, orthogonalize
from oracles.dion2_reference import selects_rows
from oracles.rounding import ulp

UNMOVED = 1e-9
"""A slice of the reference's orthogonalized part below this fraction of its largest slice is one the
reference's selection left out (exactly zero in exact arithmetic; the inverse of the update leaves ~1e-14)."""
KERNEL_ROW_MIN = 3
"""kernel_row_left fits rows of at least this many entries: one factor per row of n entries takes 1/n of an
error with no row structure (all of it at n = 1)."""


class Declared(Target):
    """A target as the diagnosis sees it: the conventions it declares, and no runs."""

    def __init__(self, name: str, conventions: Callable[[Case], Conventions]) -> None:
        self.name, self._conventions = name, conventions

    @classmethod
    def of(cls, target: Target) -> "Declared":
        return cls(target.name, target.conventions)

    def conventions(self, case: Case) -> Conventions:
        return self._conventions(case)

    def run(self, params: Sequence[torch.Tensor], grads: Sequence[Sequence[torch.Tensor]],
            case: Case) -> list[list[torch.Tensor]]:
        raise RuntimeError(f"the diagnosis reads what the checks judged; it never runs {self.name}")


@dataclasses.dataclass(frozen=True)
class Structure:
    """The error's structure: each field as the module docstring defines it."""

    errors: list[float]
    first_ok: bool | None
    factor: float
    factor_left: float
    along_param: float
    row_left: float
    kernel_row_left: float | None
    step_factors: list[float]
    step_left: float
    shrink: float | None
    error: float
    noise: float
    selection: int = 0
    swapped: float | None = None
    swaps: int = 0
    shard_left: float | None = None

    def beyond_noise(self, left: float) -> float:
        """`left` (a fraction of the error a model leaves) less, in quadrature, the fraction a correct
        run's own error accounts for: rounding noise is no part of any model of a defect."""
        if not (self.noise and self.error):
            return left
        return math.sqrt(max(0.0, left**2 - min(1.0, self.noise / self.error) ** 2))


def correct_error(pol: tolerance.CasePolicy, member: int, step: int, ref: np.ndarray, x_ref: np.ndarray,
                  param_dtype: str) -> float:
    """||err|| a correct run shows on one step as the tolerance policy measured it: the key's median
    coefficient x u x max(1, A) of the step's direction, times ||dref||, plus the storage rounding of
    the new parameter (STORAGE_ULPS ulps, the allowance the measured coefficients are beyond)."""
    amplification = pol.sensitivities[member][step].amplification
    return (pol.measured.median[tolerance.STATISTIC] * pol.u * max(1.0, amplification) * float(np.linalg.norm(ref))
            + STORAGE_ULPS * float(np.linalg.norm(ulp(x_ref, param_dtype))))


def relative_error(case: Case, declared: Declared, inputs: Inputs, traj: Trajectory) -> float:
    """||err|| / ||dref|| over every step and member of `traj`, a run of `inputs`."""
    err_sq = ref_sq = 0.0
    for _, x_prev, x_new, x_ref in reference_steps(case, declared, inputs.params, inputs.grads, traj):
        err_sq += float(np.sum(((x_new - x_prev) - (x_ref - x_prev)) ** 2))
        ref_sq += float(np.sum((x_ref - x_prev) ** 2))
    return math.sqrt(err_sq / ref_sq) if ref_sq else math.inf


def moved_slices(case: Case, conv: Conventions, x_prev: np.ndarray, x_new: np.ndarray,
                 x_ref: np.ndarray) -> int:
    """How many slices of the matrix view (the side the algorithm selects) the judged step moves where the
    reference's does not, or leaves unmoved where the reference's moves them. Each slice of the judged
    orthogonalized part (orthogonal_part) counts without its component along the slice of the previous
    parameter (where a wrong weight decay puts its error, on every slice alike), moved beyond RELATION_ULPS
    ulps of its new parameter; the reference's is zero exactly where its selection leaves a slice out."""
    scale = case.lr * lr_scale(x_prev.shape, conv.lr_scale, conv.lr_dims)
    judged = matrix_view(orthogonal_part(x_prev, x_new, case, conv), case.flatten)
    wanted = matrix_view(orthogonal_part(x_prev, x_ref, case, conv), case.flatten)
    spacing = matrix_view(ulp(x_ref, case.param_dtype), case.flatten) / scale
    params = matrix_view(x_prev, case.flatten)
    rows_only = algorithm(case).rows_only
    count = 0
    for a, b, s, x in zip(judged, wanted, spacing, params):
        if not selects_rows(b.shape, rows_only):
            a, b, s, x = a.T, b.T, s.T, x.T
        along = np.einsum("ij,ij->i", a, x) / np.maximum(np.einsum("ij,ij->i", x, x), np.finfo(float).tiny)
        got = np.linalg.norm(a - along[:, None] * x, axis=1)
        want, floor = np.linalg.norm(b, axis=1), RELATION_ULPS * np.linalg.norm(s, axis=1)
        left_out = want <= UNMOVED * want.max(initial=0.0)
        count += int(np.sum(left_out & (got > floor)) + np.sum(~left_out & (want > 2 * floor) & (got <= floor)))
    return count


def _rows_left(step: np.ndarray, ref: np.ndarray, rows: int) -> float:
    """||step - c ref||^2 left after the least-squares factor c of each of `rows` rows (the arrays viewed as
    [rows, -1])."""
    s, r = step.reshape(rows, -1), ref.reshape(rows, -1)
    rr = np.einsum("ij,ij->i", r, r)
    c = np.where(rr > 0, np.einsum("ij,ij->i", s, r) / np.where(rr > 0, rr, 1.0), 0.0)
    return float(np.sum((s - c[:, None] * r) ** 2))


def structure(case: Case, declared: Declared, judged: Judged) -> Structure:
    """The structure of the error of the judged trajectory of `case` (see the module docstring)."""
    traj = judged.trajectory
    assert traj is not None, "a case that ran"
    inputs = make_inputs(case)
    conv = declared.conventions(case)
    try:
        pol = tolerance.for_case(case, conv, [[f64(g) for g in step] for step in inputs.grads], judged.device)
    except tolerance.NoEntry:
        pol = None
    selects = algorithm(case).selects and conv.weight_decay_mask == "all" and conv.decay_dtype == "fp64"
    margins: list[float] = []
    steps = list(reference_steps(case, declared, inputs.params, inputs.grads, traj, margins))
    first_ok = None if pol is None else True
    per_step: dict[int, float] = {}
    num = den = err_sq = step_left_sq = row_left_sq = kernel_left_sq = noise_sq = 0.0
    kernel_rows = case.flatten and len(case.shape) > 2 and case.shape[-1] >= KERNEL_ROW_MIN
    along, step_factors, selection = [], [], 0
    for n, (_, x_prev, x_new, x_ref) in enumerate(steps):
        i, k = divmod(n, case.steps)
        step, ref = x_new - x_prev, x_ref - x_prev
        err = step - ref
        ref_norm, err_norm = float(np.linalg.norm(ref)), float(np.linalg.norm(err))
        if k == 0 and pol is not None:
            tol = pol.at(i, 0)
            first_ok = first_ok and compare_step(x_prev, x_new, x_ref, case.param_dtype, tol.rtol,
                                                 tol.storage_ulps).ratio <= 1.0
        per_step[k] = max(per_step.get(k, 0.0), err_norm / ref_norm if ref_norm else (math.inf if err_norm else 0.0))
        num += float(np.vdot(step, ref))
        den += float(np.vdot(ref, ref))
        if ref_norm:
            c_step = float(np.vdot(step, ref)) / ref_norm**2
            step_factors.append(c_step)
            step_left_sq += float(np.sum((step - c_step * ref) ** 2))
        err_sq += err_norm**2
        if pol is not None:
            noise_sq += correct_error(pol, i, k, ref, x_ref, case.param_dtype) ** 2
        x_norm = float(np.linalg.norm(x_prev))
        if err_norm and x_norm:
            along.append(abs(float(np.vdot(err, x_prev))) / (err_norm * x_norm))
        row_left_sq += _rows_left(step, ref, case.shape[0])
        if kernel_rows:
            kernel_left_sq += _rows_left(step, ref, step.size // case.shape[-1])
        if selects:
            selection += moved_slices(case, conv, x_prev, x_new, x_ref)
    swapped, swaps = _swapped(case, conv, steps) if case.megabatch > 1 else (None, 0)
    if selects and margins and algorithm(case).ill_posed(case, min(margins)):
        selection = 0  # a tie: either slice is a correct selection
    factor = num / den if den else math.nan
    left_sq = sum(float(np.sum(((x_new - x_prev) - factor * (x_ref - x_prev)) ** 2))
                  for _, x_prev, x_new, x_ref in steps)
    err_total = math.sqrt(err_sq)
    rel = err_total / math.sqrt(den) if den else math.inf
    scaled_run = judged.scaled()
    shrink = None
    if scaled_run is not None:
        scaled = relative_error(case, declared, inputs.scaled(SCALE_FACTOR), scaled_run)
        shrink = rel / scaled if scaled else (math.inf if rel else 1.0)

    def left(sq: float) -> float:
        return math.sqrt(sq) / err_total if err_total else 0.0

    return Structure(errors=[per_step[k] for k in sorted(per_step)], first_ok=first_ok, factor=factor,
                     factor_left=left(left_sq), along_param=float(np.mean(along)) if along else 0.0,
                     row_left=left(row_left_sq), kernel_row_left=left(kernel_left_sq) if kernel_rows else None,
                     step_factors=step_factors, step_left=left(step_left_sq),
                     shrink=shrink, error=rel, noise=math.sqrt(noise_sq / den) if den else 0.0, selection=selection,
                     swapped=swapped, swaps=swaps,
                     shard_left=_shard_left(case, conv, inputs, steps))


def _shard_left(case: Case, conv: Conventions, inputs: Inputs,
                steps: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]) -> float | None:
    """shard_left of Structure (`steps` as reference_steps yields them, member-major); None unless the layout
    shards one dim into two or more non-empty pieces and the algorithm selects nothing."""
    if shard_dim(case.layout) is None or algorithm(case).selects:
        return None
    boxes = [box for box in regions(case.layout, case.world_size, case.shape)
             if all(b.start is None or b.stop > b.start for b in box)]
    if len(boxes) < 2:
        return None
    directions = algorithm(case).directions(case, conv)
    left_sq = own_sq = 0.0
    for i in range(case.megabatch):
        state = directions.initial
        for k in range(case.steps):
            state, mats = directions.step(state, f64(inputs.grads[k][i]))
            u = np.asarray(mats).reshape(case.shape)
            _, x_prev, x_new, x_ref = steps[i * case.steps + k]
            judged, wanted = orthogonal_part(x_prev, x_new, case, conv), orthogonal_part(x_prev, x_ref, case, conv)
            own_sq += float(np.sum((judged - wanted) ** 2))
            for box in boxes:
                piece = matrix_view(orthogonalize(u[box], conv.orthogonalizer, case.flatten), case.flatten)
                mine = matrix_view(judged[box], case.flatten)
                left_sq += _rows_left(mine, piece, mine.shape[0] * mine.shape[1])
    return math.sqrt(left_sq / own_sq) if own_sq else 1.0


def _swapped(case: Case, conv: Conventions, steps: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]
             ) -> tuple[float, int]:
    """(swapped, swaps) of Structure: each member's judged orthogonalized part against every member's
    reference one, step by step (`steps` as reference_steps yields them, member-major)."""
    def parts(which: int) -> list[list[np.ndarray]]:
        """Per member, per step: the orthogonalized part of the judged (2) or the reference (3) step."""
        return [[orthogonal_part(x[1], x[which], case, conv) for x in steps[i * case.steps:(i + 1) * case.steps]]
                for i in range(case.megabatch)]

    judged, wanted = parts(2), parts(3)
    nearest_sq = own_sq = 0.0
    swaps = 0
    for k in range(case.steps):
        for i in range(case.megabatch):
            gaps = [float(np.sum((judged[i][k] - wanted[j][k]) ** 2)) for j in range(case.megabatch)]
            j = int(np.argmin(gaps))
            nearest_sq, own_sq, swaps = nearest_sq + gaps[j], own_sq + gaps[i], swaps + (j != i)
    return (math.sqrt(nearest_sq / own_sq) if own_sq else 1.0), swaps


@dataclasses.dataclass(frozen=True)
class Related:
    """Two runs of the same inputs against each other, by their orthogonalized parts (orthogonal_part, each
    from its own previous parameter, under the declared conventions), over every member and step: `factor`
    the least-squares c in O_a ~ c O_b, `left` ||O_a - c O_b|| / ||O_a - O_b|| beyond the two runs' storage
    rounding (in quadrature: what rounding leaves is no part of the model)."""

    factor: float
    left: float


def related(case: Case, conv: Conventions, a: Trajectory, b: Trajectory) -> Related:
    """`a` against `b`, runs of `case`'s inputs (see Related)."""
    inputs = make_inputs(case)
    scale = case.lr * lr_scale(case.shape, conv.lr_scale, conv.lr_dims)
    num = den = diff_sq = left_sq = noise_sq = 0.0
    parts = []
    for i, p0 in enumerate(inputs.params):
        a_prev = b_prev = f64(p0)
        for k in range(case.steps):
            a_new, b_new = f64(a[k][i]), f64(b[k][i])
            oa, ob = orthogonal_part(a_prev, a_new, case, conv), orthogonal_part(b_prev, b_new, case, conv)
            parts.append((oa, ob))
            num += float(np.vdot(oa, ob))
            den += float(np.vdot(ob, ob))
            diff_sq += float(np.sum((oa - ob) ** 2))
            noise_sq += sum((STORAGE_ULPS * float(np.linalg.norm(ulp(x, case.param_dtype))) / scale) ** 2
                            for x in (a_new, b_new))
            a_prev, b_prev = a_new, b_new
    factor = num / den if den else math.nan
    for oa, ob in parts:
        left_sq += float(np.sum((oa - factor * ob) ** 2))
    if not diff_sq:
        return Related(factor, 0.0)
    return Related(factor, math.sqrt(max(0.0, left_sq - noise_sq) / diff_sq))


def scale_relation(case: Case, traj: Trajectory, scaled: Trajectory) -> list[float]:
    """Per step, the worst member's ratio of the scale relation (harness.judging.robust_checks.rescale_check):
    the run with gradients x 2^10 against the run as drawn, each step from each run's own previous parameter,
    exact up to RELATION_ULPS ulps of the parameter dtype. Both runs start from one state, so a normaliser
    whose eps can tell the scales apart breaks the relation from the first step, and state that keeps the
    gradients' scale wrong breaks it from the second."""
    inputs = make_inputs(case)
    worst = [0.0] * case.steps
    for i, p0 in enumerate(inputs.params):
        a_prev = b_prev = f64(p0)
        for k in range(case.steps):
            a_new, b_new = f64(traj[k][i]), f64(scaled[k][i])
            ratio = compare_step(a_prev, a_new, a_prev + (b_new - b_prev), case.param_dtype, 0.0, RELATION_ULPS).ratio
            worst[k] = max(worst[k], ratio)
            a_prev, b_prev = a_new, b_new
    return worst
