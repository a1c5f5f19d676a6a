"""bf16-robust checks: statistics of the update that bf16 rounding barely moves and that
plausible defects move systematically.

With bf16 in a case, the normwise error of the update is rounding of the orthogonalized
matrix, a few percent to a tenth of the update, so `reference` cannot see a defect that
changes the update by a percent or less, however systematic. Each statistic below is a
signed average over every step and member (rounding has no preferred sign and averages
out; a defect has one sign everywhere), judged against the measured noise of correct bf16
implementations (harness/policy/noise.py), except `probe` and `rescale`, exact relations:

  norm      mean of <err, dref> / ||dref||^2: the update's size along the correct update
            (an lr-scale formula, a coefficient, decay after the update)
  decay     mean of <err, x> / (||x|| ||dref||): the error's component along the parameter,
            by projection (weight decay missing, doubled, with the wrong lr)
  spectrum  Muon only: log of the target's orthogonalized part O against the oracle's f(sigma)
            along each singular pair (p, sigma, q) of the direction U the step orthogonalizes,
            log(p^T O q / f(sigma)) (O recovered from the step through the declared conventions):
            their mean and their spread (a coefficient off in its 4th digit). Only the singular
            values rounding resolves count: sigma >= SV_RESOLVED u sigma_max, and f(sigma) at
            least SV_RESOLVED x the storage rounding of the new parameter (see SV_RESOLVED)
  rows      NorMuon only: the spread (std) of log(row norm of the target's O / the reference's),
            each matrix's mean log ratio removed: a row's norm averages its bf16 rounding over
            the row, while row statistics gone wrong (variance without its EMA, per-row state
            mixed up) rescale rows systematically
  probe     a relation in which bf16 rounding cancels: the case run with weight decay
            PROBE_WEIGHT_DECAY and without. Decay never enters the orthogonalized direction,
            so each decayed step is the declared decay of its previous parameter plus the
            undecayed run's step, to the storage rounding (decay order, its lr, a decay
            missing or coupled into the gradient). A target declaring decay folded into its
            held update (Conventions.decay_dtype) is judged with O + wd X in that format, to
            one of its ulps per entry
  rescale   the scale relation, in which bf16 rounding cancels too: gradients x 2^10 (exact in
            every format) repeat the run to the storage rounding wherever the declared
            normaliser's eps is below half an fp32 ulp of s ||U|| (_eps_visible):
            momentum is linear and the normaliser divides a power of two out exactly, so a
            correct run repeats its own roundings (an eps far larger than declared)
  drift     Muon and NorMuon cases of DRIFT_MIN_STEPS steps or more, fp32/fp64 parameters: a
            DRIFT_FACTOR x longer run with the case's first gradients every step; the growth of the
            accumulated displacement's relative error from the first eighth of the steps to the end
            (a bf16 momentum buffer stagnates: state accumulated wrong), against the worst growth of
            correct bf16 implementations per layer (harness/policy/noise.py)

err = dX - dref with dX the target's step and dref the FP64 reference step from the same
previous parameter (harness.judging.checks.reference_steps). They apply where bf16 is involved
(param or declared compute dtype) and gradients of full rank (not rankdef or zero: their bf16
reference is ill-posed). Tolerance: the allowance of the worst |statistic| the calibration panel showed,
per noise key (harness/policy/noise.py).
"""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Callable, Iterator

import numpy as np

from cases import Case
from harness.algorithms import algorithm
from harness.judging import checks as base
from harness.judging.metrics import Metrics, compare_step
from harness.judging.outcome import NO_METRICS, Outcome, Trajectory, describe, worst_of
from harness.policy import keys, noise, tolerance
from harness.policy.bounds import RELATION_ULPS, STORAGE_ULPS, Tolerance, storage_relation
from harness.policy.ill_posed import NOISE_CEILING
from harness.policy.noise import Noise
from harness.running.inputs import Inputs, f64
from harness.targets.base import Target
from oracles import Conventions, lr_scale, matrix_view
from oracles.rounding import round_to, ulp

PROBE_WEIGHT_DECAY = 10.0
"""lr x wd = 0.2: decay after the update changes a step by a fifth of its update."""
RESCALE_GRADIENTS = ("gaussian", "lowrank", "huge")
"""Gradient kinds `rescale` judges: under tiny gradients the declared eps dominates the normaliser."""
STATISTICS = ("norm", "decay", "sv_mean", "sv_spread", "row_spread")
ROBUST = ("norm", "spectrum", "rows", "probe", "rescale", "drift")
"""The bf16-robust checks, by name (harness/judging/registry.py says which apply to a case)."""

STATISTIC_CHECKS = types.MappingProxyType({"norm": ("norm", "decay"), "spectrum": ("sv_mean", "sv_spread"),
                                           "rows": ("row_spread",), "drift": ("drift",)})
"""The robust checks judging statistics (all but probe and rescale), with the statistics each judges; an
algorithm names its own beyond norm and drift (harness/algorithms: `robust_checks`)."""
DRIFT_MIN_STEPS = 8
"""`drift` judges the cases of at least this many steps (none in the CI tier: its 128-step trajectory costs
~1-3 s a case on CPU; the selftest's own long cases, harness.apps.selftest.DRIFT_CASES)."""
DRIFT_FACTOR = 16
"""`drift` runs DRIFT_FACTOR x the case's steps (128 for 8) with the case's first gradients every step."""


def extra_statistics(optimizer: str) -> set[str]:
    """The statistics beyond norm and decay that the robust checks of algorithm `optimizer` judge."""
    return {s for name in algorithm(optimizer).robust_checks for s in STATISTIC_CHECKS[name]}

GRADIENTS = ("gaussian", "lowrank", "tiny", "huge")
"""Gradient kinds judged: not the rank-deficient ones (rankdef, zero), whose bf16 reference is ill-posed."""
SV_FLOOR = 1e-3
"""Singular values (row norms) of the reference's orthogonalized part below this (relative to its largest)
are rank-deficiency noise and are left out of `spectrum` (`rows`)."""
SV_RESOLVED = 2.0
"""`spectrum` leaves out the singular values of U below SV_RESOLVED x u x s_max (u: the unit roundoff of
the coarser of the parameter and compute formats, bf16's 2^-8 here). Rounding U moves each entry by up
to u of itself, which moves a singular value by up to ~u s_max: one below that is not resolved, and no
correct bf16 implementation can return its f(sigma). Measured (ours, conv2d 8x4x3x3 unflattened: 3 x 3
matrices, seeds 0-11, mb5, fp32@bf16 and bf16@fp32, NS and PE, 23040 singular values): worst
|log(p^T O q / f(sigma))| 1.6-3.5 for sigma < u s_max, 0.37 in [0.5, 1) u s_max, 0.09-0.11 in
[1, 4) u s_max, at most 0.25 above; one sigma at 2.5e-4 s_max of 480 made a correct step's spread
0.107 (1.8x its tolerance) where the resolved ones give 0.020.
Likewise a pair whose f(sigma) moves the parameter by less than SV_RESOLVED x the storage rounding the
harness allows (STORAGE_ULPS ulps, Frobenius over the matrix) is left out: a bf16 1 x 1
matrix (conv2d_k1 unflattened) with tiny gradients steps by less than half an ulp of its parameter,
stores no change, and its log ratio is -690 (sv_spread 119)."""


def applies(case: Case, compute_dtype: str) -> bool:
    """Whether the robust checks judge `case` run in `compute_dtype`: bf16 involved, a judged gradient
    kind, one process, and a layer and algorithm whose noise was measured."""
    return ("bf16" in (case.param_dtype, compute_dtype) and case.grad in GRADIENTS and case.layout == "single"
            and noise.covers(case))


def orthogonal_part(x_prev: np.ndarray, x_new: np.ndarray, case: Case, conv: Conventions) -> np.ndarray:
    """O with x_new = apply_update(x_prev, O) under the declared conventions (exact inverse in FP64)."""
    scale = lr_scale(x_prev.shape, conv.lr_scale, conv.lr_dims)
    lr_wd = case.lr if conv.weight_decay_lr == "base" else case.lr * scale
    decay = 1.0 - lr_wd * case.weight_decay
    if conv.weight_decay_order == "before":
        return (x_prev * decay - x_new) / (case.lr * scale)
    return (x_prev - x_new / decay) / (case.lr * scale)


def _directions(case: Case, conv: Conventions, inputs: Inputs) -> Iterator[np.ndarray]:
    """The matrices [B, m, n] the FP64 reference orthogonalizes, per member and step in the order of
    harness.judging.checks.reference_steps (the algorithm's directions: harness/algorithms.py)."""
    directions = algorithm(case).directions(case, conv)
    for i in range(len(inputs.params)):
        m = directions.initial
        for k in range(case.steps):
            m, mats = directions.step(m, f64(inputs.grads[k][i]))
            yield mats


def spectrum_logs(judged: np.ndarray, wanted: np.ndarray, direction: np.ndarray, u: float,
                  storage: np.ndarray) -> list[float]:
    """log(p^T O q / p^T O_ref q) over the singular pairs (p, s, q) of each matrix of `direction` (U) that
    rounding resolves: s >= SV_RESOLVED u s_max, and p^T O_ref q >= SV_RESOLVED x that matrix's
    `storage` (the storage rounding of the new parameter, in O's units) and above SV_FLOOR of the
    largest. O_ref = P f(S) Q^T, so p^T O_ref q = f(s), and p^T O q is O's value along the same pair.
    Paired by U's singular vectors, not by sorting: an unresolved f(s) may sit anywhere among the others."""
    out: list[float] = []
    for a, b, d, floor in zip(judged, wanted, direction, storage):
        p, s, qt = np.linalg.svd(d, full_matrices=False)
        if not s.size or s[0] == 0.0:
            continue
        along = lambda o: np.einsum("ij,ik,jk->j", p, o, qt)
        got, want = along(a), along(b)
        keep = (s >= SV_RESOLVED * u * s[0]) & (want >= SV_RESOLVED * floor) & (want > SV_FLOOR * want.max())
        out.extend(np.log(np.maximum(got[keep], 1e-300) / want[keep]).tolist())
    return out


def storage_rounding(x_ref: np.ndarray, case: Case, conv: Conventions) -> np.ndarray:
    """Per matrix of the view, the bound the harness allows for storing the new parameter in its dtype,
    STORAGE_ULPS ||ulp(x_ref)||_F, in the units of the orthogonalized part (divided by lr x scale)."""
    spacing = matrix_view(ulp(x_ref, case.param_dtype), case.flatten)
    scale = lr_scale(x_ref.shape, conv.lr_scale, conv.lr_dims)
    return STORAGE_ULPS * np.linalg.norm(spacing, axis=(-2, -1)) / (case.lr * scale)


def statistics(case: Case, target: Target, inputs: Inputs, traj: Trajectory,
               spectrum: bool = True, resolved_as: Case | None = None) -> dict[str, float]:
    """norm, decay (and, with `spectrum`, sv_mean, sv_spread for Muon, row_spread for NorMuon) over
    every step and member of one run. `resolved_as` (default `case`): the case whose rounding decides
    which singular pairs the spectrum counts (the selftest's fp64 twin of a bf16 case counts those the
    bf16 case resolves, not the ones only fp64 resolves)."""
    conv = target.conventions(case)
    resolved_as = resolved_as or case
    resolution = target.conventions(resolved_as)
    norm, decay, logs, rows = [], [], [], []
    u = tolerance.unit_roundoff(max((resolved_as.param_dtype, resolution.compute_dtype), key=tolerance.unit_roundoff))
    steps = base.reference_steps(case, target, inputs.params, inputs.grads, traj)
    for (_, x_prev, x_new, x_ref), direction in zip(steps, _directions(case, conv, inputs)):
        step, ref = x_new - x_prev, x_ref - x_prev
        ref_sq = float(np.vdot(ref, ref))
        if ref_sq == 0.0 or not np.all(np.isfinite(step)):
            norm.append(math.inf if ref_sq else 0.0)
            continue
        err = step - ref
        norm.append(float(np.vdot(err, ref)) / ref_sq)
        x_norm = float(np.linalg.norm(x_prev))
        decay.append(float(np.vdot(err, x_prev)) / (x_norm * math.sqrt(ref_sq)) if x_norm else 0.0)
        if spectrum and "sv_mean" in extra_statistics(case.optimizer):
            judged = matrix_view(orthogonal_part(x_prev, x_new, case, conv), case.flatten)
            wanted = matrix_view(orthogonal_part(x_prev, x_ref, case, conv), case.flatten)
            logs.extend(spectrum_logs(judged, wanted, direction, u, storage_rounding(x_ref, resolved_as, resolution)))
        if spectrum and "row_spread" in extra_statistics(case.optimizer):
            judged = matrix_view(orthogonal_part(x_prev, x_new, case, conv), case.flatten)
            wanted = matrix_view(orthogonal_part(x_prev, x_ref, case, conv), case.flatten)
            for a, b in zip(judged, wanted):
                ra, rb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
                keep = rb > SV_FLOOR * rb.max() if rb.size and rb.max() > 0 else rb > 0
                if keep.sum() > 1:
                    ratio = np.log(np.maximum(ra[keep], 1e-300) / rb[keep])
                    rows.extend((ratio - ratio.mean()).tolist())
    out = {"norm": float(np.mean(norm)), "decay": float(np.mean(decay)) if decay else 0.0}
    if logs:
        out["sv_mean"], out["sv_spread"] = float(np.mean(logs)), float(np.std(logs))
    if rows:
        out["row_spread"] = float(np.sqrt(np.mean(np.square(rows))))
    return out


def decay_expected(x_prev: np.ndarray, undecayed_step: np.ndarray, case: Case, conv: Conventions,
                   weight_decay: float, observed: np.ndarray) -> np.ndarray:
    """x_new of the run with `weight_decay` from its own x_prev, given the same step's update of the run
    without decay (which orthogonalizes the same directions: decay never enters them). Cautious decay
    decays the entries where x_prev and the update O agree in sign; the undecayed step is -lr scale O, so
    where it rounded to zero in the parameter format O's sign is not seen, and of the two values a
    correct run can give there (decayed or not) the one nearer `observed` (the decayed run's x_new)."""
    scale = lr_scale(x_prev.shape, conv.lr_scale, conv.lr_dims)
    lam = (case.lr if conv.weight_decay_lr == "base" else case.lr * scale) * weight_decay
    if conv.decay_dtype != "fp64":
        return _folded_expected(x_prev, undecayed_step, case, conv, weight_decay, observed)

    def stepped(decay: np.ndarray | float) -> np.ndarray:
        if conv.weight_decay_order == "before":
            return decay * x_prev + undecayed_step
        return decay * (x_prev + undecayed_step)

    if conv.weight_decay_mask != "cautious":
        return stepped(1.0 - lam)
    expected = stepped(np.where(x_prev * -undecayed_step > 0.0, 1.0 - lam, 1.0))
    decayed, kept = stepped(1.0 - lam), stepped(1.0)
    nearer = np.where(np.abs(observed - decayed) < np.abs(observed - kept), decayed, kept)
    return np.where(undecayed_step == 0.0, nearer, expected)


def _bracket_nearest(v: np.ndarray, fmt: str, wanted: np.ndarray) -> np.ndarray:
    """Per entry, of the two values of format `fmt` around `v` (v itself where it is one), the one nearer
    `wanted`: a correct rounding of v to `fmt` is one of them, whichever way it went at a tie."""
    r = round_to(v, fmt)
    other = r + np.sign(v - r) * ulp(v, fmt)
    return np.where(np.abs(wanted - r) <= np.abs(wanted - other), r, other)


def _folded_expected(x_prev: np.ndarray, undecayed_step: np.ndarray, case: Case, conv: Conventions,
                     weight_decay: float, observed: np.ndarray) -> np.ndarray:
    """decay_expected for decay folded into the update (Conventions.decay_dtype): x_prev - step W with
    W = round(O + (lr_wd / step) wd x_prev mask) in decay_dtype, O = -undecayed_step / step (the same O the
    undecayed run applied). That rounding does not cancel between the runs (bf16: 2^-9 of |O + wd X|, ~1e3
    ulps of an fp32 parameter), so W is judged as either bf16 neighbour of the exact sum, the one nearer the
    observed W: the relation then still sees the decay to one bf16 ulp of W per entry (a decay missing,
    doubled or with the other lr moves W by ~lr wd |X| / step, tens of its ulps at the probe's wd)."""
    def hold(v: float) -> float:  # a scalar as the target holds it (Conventions.lr_dtype)
        return float(round_to(np.float64(v), conv.lr_dtype))

    lr = hold(case.lr)
    step = hold(lr * hold(lr_scale(x_prev.shape, conv.lr_scale, conv.lr_dims)))
    ratio = (lr if conv.weight_decay_lr == "base" else step) / step
    o = -undecayed_step / step
    w_observed = (x_prev - observed) / step

    def stepped(mask: np.ndarray | float) -> np.ndarray:
        exact = o + ratio * weight_decay * x_prev * mask
        return x_prev - step * _bracket_nearest(exact, conv.decay_dtype, w_observed)

    if conv.weight_decay_mask != "cautious":
        return stepped(1.0)
    expected = stepped(np.where(x_prev * o > 0.0, 1.0, 0.0))
    decayed, kept = stepped(1.0), stepped(0.0)
    nearer = np.where(np.abs(observed - decayed) < np.abs(observed - kept), decayed, kept)
    return np.where(undecayed_step == 0.0, nearer, expected)


def probe_check(case: Case, target: Target, inputs: Inputs, traj: Trajectory) -> Outcome:
    """The decay relation, where bf16 rounding cancels: the case run with weight decay
    PROBE_WEIGHT_DECAY and without, on the same inputs. Both orthogonalize the same directions, so
    each decayed step must be the declared decay of its own previous parameter plus the undecayed
    run's step, up to the parameter dtype's storage rounding (RELATION_ULPS ulps). Both are built explicitly
    (`Case.construct`): a weight decay the probe sets is no default."""
    decayed, plain = (dataclasses.replace(case, weight_decay=w, construct="explicit")
                      for w in (PROBE_WEIGHT_DECAY, 0.0))
    why = target.unsupported(decayed) or target.unsupported(plain)
    if why is not None:
        return Outcome("probe", NO_METRICS, None, f"probe case unsupported by the target: {why}",
                            skipped=True)
    conv = target.conventions(case)
    if conv.rounding == "stochastic":
        return Outcome("probe", NO_METRICS, None, f"ill-posed: the target rounds U to {conv.compute_dtype} "
                            "stochastically, so the decayed and undecayed runs round differently and nothing cancels",
                            skipped=True)
    a = target.run(inputs.params, inputs.grads, decayed)
    b = target.run(inputs.params, inputs.grads, plain)
    metrics, where = _stepwise(case, inputs, a, b, lambda a_prev, a_new, b_step: decay_expected(
        a_prev, b_step, case, conv, PROBE_WEIGHT_DECAY, a_new))
    tol = storage_relation(f"decay relation at weight decay {PROBE_WEIGHT_DECAY:g}")
    return Outcome("probe", metrics, tol, f"decay relation, wd {PROBE_WEIGHT_DECAY:g} vs 0: "
                                               + describe(metrics, where, tol))


def _stepwise(case: Case, inputs: Inputs, a: Trajectory, b: Trajectory,
              expected: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]) -> tuple[Metrics, str]:
    """The worst step of run `a` against `expected(a_prev, a_new, b_step)`, each run stepping from
    its own previous parameter (b_step: run b's step there), exact up to RELATION_ULPS ulps of the
    parameter dtype, member by member and step by step."""
    pairs = []
    for i, p0 in enumerate(inputs.params):
        a_prev = b_prev = f64(p0)
        for k in range(case.steps):
            a_new, b_new = f64(a[k][i]), f64(b[k][i])
            pairs.append((compare_step(a_prev, a_new, expected(a_prev, a_new, b_new - b_prev), case.param_dtype,
                                       0.0, RELATION_ULPS), f"member {i} step {k + 1}"))
            a_prev, b_prev = a_new, b_new
    return worst_of(pairs)


def _eps_visible(case: Case, conv: Conventions, inputs: Inputs) -> str | None:
    """Why the declared normaliser can tell the run with gradients x 2^10 from the run without, or None
    where it cannot: for every matrix U the FP64 reference orthogonalizes, eps is below half an fp32 ulp
    of s ||U||_F (form "plus": fl(s ||U|| + eps) is fl(s ||U||) at both scales, in fp32 or a coarser
    format) or below s ||U||_F (form "clamp": max(s ||U||, eps) is s ||U||)."""
    spec = conv.orthogonalizer
    if spec.kind != "polynomial":
        return f"not judged: a {spec.kind} orthogonalizer has no normaliser that divides the scale out"
    directions = algorithm(case).directions(case, conv)
    norms = []
    for i in range(len(inputs.params)):
        m = directions.initial
        for k in range(case.steps):
            m, mats = directions.step(m, f64(inputs.grads[k][i]))
            norms.extend(float(np.linalg.norm(x)) for stack in (mats if isinstance(mats, list) else [mats]) for x in stack)
    denominators = spec.normaliser.scale * np.asarray(norms)
    # "plus" adds eps to s ||U||: invisible below half its fp32 ulp; "clamp" takes s ||U|| wherever it exceeds eps
    bound = 0.5 * ulp(denominators, "fp32") if spec.normaliser.form == "plus" else denominators
    if not np.all(spec.normaliser.eps < bound):
        return (f"not judged: the declared normaliser eps {spec.normaliser.eps:g} can change the normaliser "
                f"s ||U|| (smallest {denominators.min():.3g}, form {spec.normaliser.form!r}) at one scale and "
                f"not the other")
    return None


def rescale_check(case: Case, target: Target, inputs: Inputs, traj: Trajectory) -> Outcome:
    """The scale relation, where bf16 rounding cancels: the target's run with gradients x 2^10 against
    its own run without, step by step from each run's own previous parameter, exact up to RELATION_ULPS
    ulps of the parameter dtype; judged where the declared eps is negligible (_eps_visible)."""
    conv = target.conventions(case)
    if conv.rounding == "stochastic":
        return Outcome("rescale", NO_METRICS, None, f"ill-posed: the target rounds U to {conv.compute_dtype} "
                            "stochastically, so the scaled and unscaled runs round differently and nothing cancels",
                            skipped=True)
    why = _eps_visible(case, conv, inputs)
    if why is not None:
        return Outcome("rescale", NO_METRICS, None, why, skipped=True)
    scaled = inputs.scaled(base.SCALE_FACTOR)
    other = target.run(scaled.params, scaled.grads, case)
    metrics, where = _stepwise(case, inputs, traj, other, lambda a_prev, a_new, b_step: a_prev + b_step)
    tol = storage_relation(f"scale relation, gradients x {base.SCALE_FACTOR:g}")
    return Outcome("rescale", metrics, tol, f"gradients x {base.SCALE_FACTOR:g} vs x 1: "
                                                 + describe(metrics, where, tol), run=other)


def judge(name: str, values: dict[str, float], measured: Noise | None, key: object) -> Outcome:
    """Outcome of robust check `name` from its statistics: the worst |value| / allowance under the `measured`
    noise of `key` (None: unmeasured, not judged)."""
    if measured is None:
        return Outcome(name, NO_METRICS, None, f"no measured bf16 noise for {key}: not judged", skipped=True)
    unmeasured = sorted(set(values) - set(measured.worst))
    if unmeasured:
        return Outcome(name, NO_METRICS, None, f"no measured bf16 noise of {unmeasured} for {key}: "
                                                         f"not judged", skipped=True)
    blind = {stat: measured.allowed(stat) for stat in values if measured.allowed(stat) >= NOISE_CEILING}
    if len(blind) == len(values):
        return Outcome(name, NO_METRICS, None, (
            f"not judged: the panel's own bf16 noise on {key} allows "
            + ", ".join(f"{s} {t:.3g}" for s, t in blind.items())
            + f", at or above {NOISE_CEILING:g}: a correct run there is as far off as a wrong one"), skipped=True)
    values = {stat: value for stat, value in values.items() if stat not in blind}
    ratios = {}
    for stat, value in values.items():
        tol = measured.allowed(stat)
        ratios[stat] = abs(value) / tol if tol > 0 else (0.0 if value == 0 else math.inf)
    if any(math.isnan(v) for v in values.values()):
        ratios = {s: math.inf for s in values}
    worst = max(ratios, key=ratios.get)
    tol_value = measured.allowed(worst)
    source = measured.source(worst)
    message = f"worst {worst}: " + ", ".join(f"{s} {values[s]:+.3g} ({ratios[s]:.2g} x allowed)" for s in values)
    metrics = Metrics(max_abs=math.nan, rel_err=abs(values[worst]), max_ulp=math.nan, allowed=tol_value,
                      ratio=ratios[worst])
    return Outcome(name, metrics, Tolerance(tol_value, 0.0, source), message)


def worst_statistic(message: str) -> str:
    """The statistic a robust check's message names as its worst ("" for another message)."""
    return message.split(":", 1)[0].removeprefix("worst ") if message.startswith("worst ") else ""


# --- drift: a long trajectory under a persistent gradient --------------------------------------------

def drift_applies(case: Case) -> bool:
    """Whether `drift` judges `case` (besides `applies`): Muon or NorMuon, fp32 or fp64 parameters (a bf16
    parameter's storage rounding grows with the parameter over the long trajectory: measured, ours' drift
    on muon bf16@bf16 Polar Express linear_tall grew from 0.021 over the first eighth to 0.066), at least
    DRIFT_MIN_STEPS steps."""
    return algorithm(case).drift and case.param_dtype != "bf16" and case.steps >= DRIFT_MIN_STEPS


def drift_stream(case: Case, inputs: Inputs) -> tuple[Case, Inputs]:
    """The drift trajectory: DRIFT_FACTOR x the case's steps, each step the case's first gradients."""
    long = dataclasses.replace(case, steps=DRIFT_FACTOR * case.steps)
    return long, Inputs(inputs.params, [inputs.grads[0]] * long.steps, inputs.flatten)


def drift_statistics(case: Case, target: Target, inputs: Inputs) -> dict[str, float]:
    """The target's drift trajectory against the FP64 reference, each step from the target's own previous
    parameter: `drift_level` = ||sum_k err_k|| / ||sum_k dref_k|| over every member (the accumulated error
    of the displacement, relative), `drift_early` the same over the first eighth of the steps, and
    `drift` = drift_level - drift_early, the error's growth: a correct run's error, once momentum has
    converged, is the same rounding every step (one persistent gradient), so its level stays where the
    first steps put it, whatever that level (ours 0.004, a plain op-by-op bf16 loop 0.016 on one case);
    state accumulated wrong (a bf16 buffer's stagnation) makes it grow."""
    long, stream = drift_stream(case, inputs)
    traj = target.run(stream.params, stream.grads, long)
    early_steps = max(1, long.steps // 8)
    err: dict[int, np.ndarray] = {}
    ref: dict[int, np.ndarray] = {}
    early_err: dict[int, np.ndarray] = {}
    early_ref: dict[int, np.ndarray] = {}
    for n, (_, x_prev, x_new, x_ref) in enumerate(base.reference_steps(long, target, stream.params, stream.grads,
                                                                       traj)):
        member, k = divmod(n, long.steps)
        if not np.all(np.isfinite(x_new)):
            return {"drift": math.inf, "drift_level": math.inf, "drift_early": math.inf}
        err[member] = err.get(member, 0.0) + (x_new - x_ref)
        ref[member] = ref.get(member, 0.0) + (x_ref - x_prev)
        if k < early_steps:
            early_err[member], early_ref[member] = err[member].copy(), ref[member].copy()

    def relative(e: dict[int, np.ndarray], r: dict[int, np.ndarray]) -> float:
        size = math.sqrt(sum(float(np.vdot(x, x)) for x in r.values()))
        gone = math.sqrt(sum(float(np.vdot(x, x)) for x in e.values()))
        return gone / size if size else (0.0 if gone == 0.0 else math.inf)

    level, early = relative(err, ref), relative(early_err, early_ref)
    return {"drift": level - early, "drift_level": level, "drift_early": early}


def drift_check(case: Case, target: Target, inputs: Inputs, traj: Trajectory) -> Outcome:
    """The growth of the accumulated error over a DRIFT_FACTOR x longer trajectory under a persistent
    gradient (the case's first gradients every step; drift_statistics) against the allowance of the worst
    growth the calibration panel showed for its drift key (harness/policy/noise.py). A constant gradient makes momentum and a state defect's
    error coherent across the steps: a momentum buffer held in bf16 stagnates once mu's decrement falls
    below half an ulp of the buffer (after ~63 steps at mu 0.95), an entry-dependent error that grows
    where a correct fp32 buffer's does not."""
    compute = target.conventions(case).compute_dtype
    got = drift_statistics(case, target, inputs)
    out = judge("drift", {"drift": got["drift"]}, noise.of_drift(case, compute, DRIFT_FACTOR),
                keys.drift_key(case, compute))
    return dataclasses.replace(out, message=f"{out.message}; accumulated error {got['drift_level']:.3g} of the "
                                            f"{DRIFT_FACTOR * case.steps}-step displacement, "
                                            f"{got['drift_early']:.3g} over its first eighth")


def norm_check(case: Case, target: Target, inputs: Inputs, traj: Trajectory) -> Outcome:
    got = statistics(case, target, inputs, traj, spectrum=False)
    conv = target.conventions(case)
    return _judge_noise("norm", case, conv, {k: got[k] for k in ("norm", "decay")})


def spectrum_check(case: Case, target: Target, inputs: Inputs, traj: Trajectory) -> Outcome:
    got = statistics(case, target, inputs, traj)
    if "sv_mean" not in got:
        return Outcome("spectrum", NO_METRICS, None, "no singular value that rounding resolves (see "
                                                               "robust_checks.SV_RESOLVED): no spectrum to judge",
                            skipped=True)
    conv = target.conventions(case)
    return _judge_noise("spectrum", case, conv, {k: got[k] for k in ("sv_mean", "sv_spread")})


def rows_check(case: Case, target: Target, inputs: Inputs, traj: Trajectory) -> Outcome:
    got = statistics(case, target, inputs, traj)
    if "row_spread" not in got:
        return Outcome("rows", NO_METRICS, None, "fewer than two nonzero rows per matrix: no row "
                                                           "profile to judge", skipped=True)
    conv = target.conventions(case)
    return _judge_noise("rows", case, conv, {"row_spread": got["row_spread"]})


def _judge_noise(name: str, case: Case, conv: Conventions, values: dict[str, float]) -> Outcome:
    """`judge` under the bf16 noise of the compute dtype and orthogonalizer the target declares."""
    return judge(name, values, noise.of_case(case, conv.compute_dtype, conv.orthogonalizer),
                 keys.noise_key(case, conv.compute_dtype, declared=conv.orthogonalizer))
