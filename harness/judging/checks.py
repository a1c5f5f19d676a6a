"""The single-process checks and the helpers every check builds on. Each returns an `Outcome`
(harness/judging/outcome.py); harness/judging/registry.py says which apply to a case.

  reference  every step of every megabatch member vs the FP64 reference step,
             re-seeded from the target's own previous parameter (momentum in FP64)
  megabatch  a member stepped inside the megabatch == the member stepped alone
  equiv2d    flatten=True: [out, *rest] steps as the 2-D [out, prod(rest)] parameter does
  mixed      flatten=True: the members step as they do alone in one group with their negated twins of the
             other layer kind (a conv's [out, prod(rest)] Linear, a Linear's [out, in, 1, 1] 1x1 conv)
  fraction1  Dion2 / NorDion2 with fraction 1 step as Muon / NorMuon with momentum ef_decay
  scale      gradients x 2^10 vs the reference of the scaled run (the normaliser removes scale)
  finite     degenerate gradients (zero, rank-deficient, tiny, huge, extreme) give finite parameters
  nonfinite  a NaN gradient element reaches its parameter, and no other (cases with nonfinite gradients only)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator

import numpy as np
import torch

from cases import Case
from harness.algorithms import algorithm
from harness.judging import batch_invariance
from harness.judging.metrics import Metrics, compare_step
from harness.judging.outcome import NO_METRICS, Evidence, Outcome, Trajectory, describe, worst_judged, worst_of
from harness.policy import tolerance
from harness.policy.bounds import FINITENESS
from harness.running.inputs import Inputs, f64
from harness.targets.base import Target

SCALE_FACTOR = 2.0**10
"""Power of two: scaling the gradients is exact in every floating format."""



def reference_steps(case: Case, target: Target, params: list[torch.Tensor], grads: list[list[torch.Tensor]],
                    traj: Trajectory, margins: list[float] | None = None
                    ) -> Iterator[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(where, x_prev, x_new, x_ref) per member and step: x_ref is the FP64 reference step from the
    target's own previous parameter x_prev (re-seeded every step), optimizer state kept in FP64.
    `margins` (if given) collects each step's selection margin (harness.algorithms)."""
    oracle = algorithm(case).oracle(case, target.conventions(case))
    for i, p0 in enumerate(params):
        x_prev, state = f64(p0), oracle.initial
        for k in range(case.steps):
            x_ref, state, margin = oracle.step(x_prev, state, f64(grads[k][i]))
            if margins is not None:
                margins.append(margin)
            x_new = f64(traj[k][i])
            yield f"member {i} step {k + 1}", x_prev, x_new, x_ref
            x_prev = x_new


def device_class(inputs: Inputs) -> str:
    """The device class ("cpu", "cuda") the inputs were run on."""
    return "cuda" if inputs.params[0].device.type == "cuda" else "cpu"


def policy(case: Case, target: Target, inputs: Inputs) -> tolerance.CasePolicy:
    """The tolerance policy of `case` for `target`'s declared conventions (raises tolerance.NoEntry)."""
    grads = [[f64(g) for g in step] for step in inputs.grads]
    return tolerance.for_case(case, target.conventions(case), grads, device_class(inputs))


def selection_ill_posed(case: Case, target: Target, inputs: Inputs, traj: Trajectory,
                        steps: list | None = None) -> str | None:
    """Why `traj`'s selection (Dion2's top-k slices) is within rounding of a tie on some step, or None
    (harness.algorithms). `steps` (if given) collects the reference_steps it walks."""
    if not algorithm(case).selects and steps is None:
        return None  # no selection: nothing to decide, no oracle run needed
    margins: list[float] = []
    got = list(reference_steps(case, target, inputs.params, inputs.grads, traj, margins))
    if steps is not None:
        steps.extend(got)
    return algorithm(case).ill_posed(case, min(margins))


def gap_or_tie(name: str, gap: tolerance.NoEntry, case: Case, target: Target, inputs: Inputs,
               traj: Trajectory) -> Outcome:
    """A check whose policy key has no entry: `skipped` where no tolerance could judge the run (its
    selection is a tie, selection_ill_posed, or tolerance.unmeasurable_why: the measurement leaves such
    runs out, so a key reached only by them has no entry), else `unsupported` for the gap."""
    why = gap.ill_posed or selection_ill_posed(case, target, inputs, traj)
    if why:
        return Outcome(name, NO_METRICS, None, f"{why} (and {gap})", skipped=True)
    return Outcome(name, NO_METRICS, None, str(gap), unsupported=True)


def reference(case: Case, target: Target, inputs: Inputs, traj: Trajectory) -> Outcome:
    """Each step against the FP64 reference under its own derived tolerance (harness/policy/tolerance.py)."""
    try:
        pol = policy(case, target, inputs)
    except tolerance.NoEntry as gap:
        return gap_or_tie("reference", gap, case, target, inputs, traj)
    why = pol.ill_posed()
    if why:
        return Outcome("reference", NO_METRICS, None, why, skipped=True)
    steps: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = []
    why = selection_ill_posed(case, target, inputs, traj, steps)
    if why:
        return Outcome("reference", NO_METRICS, None, why, skipped=True)
    judged = []
    for n, (at, x_prev, x_new, x_ref) in enumerate(steps):
        tol = pol.at(*divmod(n, case.steps))
        judged.append((compare_step(x_prev, x_new, x_ref, case.param_dtype, tol.rtol, tol.storage_ulps),
                       (at, x_prev, x_new, x_ref), tol))
    metrics, (where, *worst), tol = worst_judged(judged)
    held = target.conventions(case).held_formats()
    return Outcome("reference", metrics, tol, describe(metrics, where, tol) + (f"; {held}" if held else ""),
                   evidence=Evidence.of(where, *worst))


def relation(name: str, case: Case, target: Target, inputs: Inputs, traj: Trajectory,
              other: Trajectory, exact: bool | None = None, across_layouts: bool = False) -> Outcome:
    """`traj` vs `other`: two runs of the same inputs that must agree, member by member, step by step;
    bitwise in fp64 where both run the same arithmetic (`exact`, by default the target's claim);
    `across_layouts`: `other` ran in one process, `traj` over the case's layout (tolerance.for_relation)."""
    exact = target.exact_relations if exact is None else exact
    try:
        tol = tolerance.for_relation(case, policy(case, target, inputs), exact, across_layouts)
    except tolerance.NoEntry as gap:
        return gap_or_tie(name, gap, case, target, inputs, traj)
    if isinstance(tol, str):
        return Outcome(name, NO_METRICS, None, tol, skipped=True)
    pairs = []
    for i, p0 in enumerate(inputs.params):
        a_prev = b_prev = f64(p0)
        for k in range(case.steps):
            a, b = f64(traj[k][i]), f64(other[k][i])
            # Bitwise relations compare the parameters; the others each run's own step (update).
            b_step = b if exact else a_prev + (b - b_prev)
            pairs.append((compare_step(a_prev, a, b_step, case.param_dtype, tol.rtol, tol.storage_ulps),
                          f"member {i} step {k + 1}"))
            a_prev, b_prev = a, b
    metrics, where = worst_of(pairs)
    return Outcome(name, metrics, tol, describe(metrics, where, tol))


def megabatch(case: Case, target: Target, inputs: Inputs, traj: Trajectory) -> Outcome:
    """Each member stepped inside the megabatch against it stepped alone. A target of exact relations
    runs the same arithmetic both ways only where this platform's batched products do not depend on
    the stack size (harness/judging/batch_invariance.py); elsewhere the relation takes its tolerance."""
    alone = [target.run(*_args(inputs.member(i)), case) for i in range(case.megabatch)]
    regrouped = [[alone[i][k][0] for i in range(case.megabatch)] for k in range(case.steps)]
    variant = _stack_variant_shapes(case, target, inputs)
    out = relation("megabatch", case, target, inputs, traj, regrouped, exact=target.exact_relations and not variant)
    if not variant:
        return out
    shapes = ", ".join(f"{m}x{n}" for m, n in variant)
    return dataclasses.replace(out, message=f"batched fp64 products of {shapes} matrices depend on the stack size "
                                            f"here (harness/judging/batch_invariance.py), not bitwise: {out.message}")


def _stack_variant_shapes(case: Case, target: Target, inputs: Inputs, copies: int | None = None
                          ) -> list[tuple[int, int]]:
    """Where a target of exact relations runs `case` in fp64, the matrix shapes whose batched products here
    depend on the stack size (batch_invariance.megabatch_variant_shapes), so that a relation across stack sizes
    is not bitwise; [] elsewhere (nothing bitwise is claimed)."""
    conv = target.conventions(case)
    if not (target.exact_relations and conv.compute_dtype == "fp64" and case.param_dtype == "fp64"):
        return []
    return batch_invariance.megabatch_variant_shapes(case, conv, inputs, copies)


def equiv2d(case: Case, target: Target, inputs: Inputs, traj: Trajectory) -> Outcome:
    flat = (case.shape[0], math.prod(case.shape[1:]))
    other = [[t.reshape(case.shape) for t in step] for step in target.run(*_args(inputs.reshaped(flat)), case)]
    return dataclasses.replace(relation("equiv2d", case, target, inputs, traj, other), run=other)


TWIN_PROBE_LAYERS = {True: "linear", False: "conv2d_k1"}
"""The CI layer whose kind a member's twin has, by whether the member is a convolution (3-D+): what the target's
`unsupported` is asked about before `mixed` hands it that kind."""


MEMBERS_HOLD = "the members step as alone"
"""How `mixed` says that only the twins failed (harness/judging/diagnosis.py reads it)."""


def twin_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of the other layer kind that flatten=True steps as `shape`: a convolution's [out, prod(rest)]
    Linear, a Linear's [out, in, 1, 1] pointwise convolution."""
    return (shape[0], math.prod(shape[1:])) if len(shape) > 2 else (*shape, 1, 1)


NOT_ODD = ("svd",)
"""Orthogonalizers whose arithmetic is not odd bit for bit: LAPACK's SVD (torch 2.13's MKL on an AVX-512 CPU) gave
the negated 8 x 20 twins of a NorMuon conv1d case a step 6e-16 off the negated member's (max_ulp 311); with MKL
held to its AVX2 code path (MKL_CBWR=AVX2) the same step was exact. The polynomial iterations are products and
sums, odd under round-to-nearest; the SVD's internal choices are its own."""


def mixed(case: Case, target: Target, inputs: Inputs, traj: Trajectory) -> Outcome:
    """flatten=True on a group that mixes layer kinds, as users set it on a whole model: the members and their
    twins (twin_shape; parameters and gradients negated) in one group. Each member must step as it does alone,
    and each twin as the negated member (every stage is odd, and negation is exact, so a twin handed its
    member's update is seen). Bitwise where the target claims exact relations, but for an orthogonalizer of
    NOT_ODD. Skipped where the target does not run the twin's kind for this case."""
    twin_kind = len(case.shape) > 2
    try:
        why = target.unsupported(dataclasses.replace(case, layer=TWIN_PROBE_LAYERS[twin_kind]))
    except ValueError as exc:
        why = f"no case of the twin's kind exists ({exc})"
    if why:
        return Outcome("mixed", NO_METRICS, None, f"the target does not run the twin layer kind here: {why}",
                       skipped=True)
    shape = twin_shape(case.shape)
    twins = inputs.reshaped(shape)
    group = Inputs(inputs.params + [-p for p in twins.params],
                   [mine + [-g for g in theirs] for mine, theirs in zip(inputs.grads, twins.grads)], inputs.flatten)
    run = target.run(*_args(group), case)
    n = case.megabatch
    members = [step[:n] for step in run]
    twins_back = [[-t.reshape(case.shape) for t in step[n:]] for step in run]
    exact = (target.exact_relations and case.orthogonalizer not in NOT_ODD
             and not _stack_variant_shapes(case, target, inputs, copies=2))
    mine = relation("mixed", case, target, inputs, members, traj, exact=exact)
    theirs = relation("mixed", case, target, inputs, twins_back, traj, exact=exact)
    if mine.skipped or mine.unsupported:
        return mine
    named = f"their negated {'x'.join(map(str, shape))} twins"
    if theirs.metrics.severity > mine.metrics.severity:
        lead = f"{MEMBERS_HOLD}, {named} do not" if mine.status == "pass" and theirs.status == "fail" else named
        return dataclasses.replace(theirs, message=f"in one group with their twins, {lead}: {theirs.message}")
    return dataclasses.replace(mine, message=f"in one group with their twins, the members: {mine.message}")


def fraction1(case: Case, target: Target, inputs: Inputs, traj: Trajectory) -> Outcome:
    """The target's run of `case` against its run of the equivalent case of another algorithm
    (Dion2 with fraction 1 selects every slice: Muon with momentum ef_decay, no Nesterov); bitwise in fp64
    only where the target claims both run the same arithmetic (`exact_equivalents`)."""
    other_case = algorithm(case).equivalent(case)
    assert other_case is not None, "fraction1 applies only where an equivalent case exists"
    why = target.unsupported(other_case)
    if why:
        return Outcome("fraction1", NO_METRICS, None, f"the equivalent case is unsupported: {why}", skipped=True)
    out = relation("fraction1", case, target, inputs, traj, target.run(*_args(inputs), other_case),
                   exact=target.exact_equivalents)
    return dataclasses.replace(out, message=f"vs {other_case.optimizer_token}: {out.message}")


SCALE_UNREPRESENTABLE = ("fp16",)
"""Compute formats whose range cannot hold gradients x SCALE_FACTOR: fp16's largest value is 65504,
and momentum sums of x 2^10 Gaussian gradients pass it (the rounded reference direction is then
infinite, so no reference exists for the arithmetic the target declares)."""


def unscalable(compute_dtype: str) -> str | None:
    """Why the scaled run cannot be judged in the declared `compute_dtype`, or None."""
    if compute_dtype in SCALE_UNREPRESENTABLE:
        return (f"not judged: gradients x {SCALE_FACTOR:g} overflow the declared {compute_dtype} compute format "
                f"(largest finite {torch.finfo(torch.float16).max:g})")
    return None


def scale(case: Case, target: Target, inputs: Inputs, traj: Trajectory) -> Outcome:
    """Gradients x 2^10 against the FP64 reference of the scaled run. NS(cG) = NS(G) only up to
    the normaliser's eps, which the reference models exactly; so this judges the invariance (and
    the target's numerical range) without a tolerance for eps."""
    why = unscalable(target.conventions(case).compute_dtype)
    if why:
        return Outcome("scale", NO_METRICS, None, why, skipped=True)
    scaled = inputs.scaled(SCALE_FACTOR)
    run = target.run(*_args(scaled), case)
    out = reference(case, target, scaled, run)
    return dataclasses.replace(out, check="scale", message=f"gradients x {SCALE_FACTOR:g}: {out.message}",
                               evidence=None, run=run)


def nonfinite(case: Case, target: Target, inputs: Inputs, traj: Trajectory) -> Outcome:
    """The documented non-finite policy of every algorithm (optimizers/algorithms/base.py, torch.optim's): a
    NaN gradient element (member 0's, at the last step) reaches that member's parameter in that step, and
    every other member steps as it does alone. A target that skips the step, zeroes the NaN or lets it
    freeze or spread to other members fails."""
    last = case.steps - 1
    problems = []
    if any(not torch.isfinite(traj[k][0]).all() for k in range(last)):
        problems.append("member 0 was non-finite before its NaN gradient arrived")
    if torch.isfinite(traj[last][0]).all():
        problems.append(f"member 0 is finite after the step its NaN gradient arrived in (step {case.steps}): the "
                        f"NaN was skipped or hidden, where the policy makes it visible")
    spread = [i for i in range(1, case.megabatch) for k in range(case.steps) if not torch.isfinite(traj[k][i]).all()]
    if spread:
        problems.append(f"members {sorted(set(spread))} became non-finite: the NaN spread beyond its parameter")
    if problems:
        return Outcome("nonfinite", Metrics(math.nan, math.nan, math.nan, math.nan, math.inf), FINITENESS,
                       "; ".join(problems))
    if case.megabatch == 1:
        return Outcome("nonfinite", Metrics(math.nan, math.nan, math.nan, math.nan, 0.0), FINITENESS,
                       f"the NaN reached member 0 at step {case.steps}, as the policy says")
    others = list(range(1, case.megabatch))
    rest = Inputs([inputs.params[i] for i in others], [[step[i] for i in others] for step in inputs.grads],
                  inputs.flatten)
    alone = [target.run(*_args(inputs.member(i)), case) for i in others]
    out = relation("nonfinite", case, target, rest, [[step[i] for i in others] for step in traj],
                   [[alone[j][k][0] for j in range(len(others))] for k in range(case.steps)], exact=False)
    return dataclasses.replace(out, message=f"the NaN reached member 0 at step {case.steps}, as the policy says; "
                                            f"the other members against each stepped alone: {out.message}")


def finite(case: Case, target: Target, inputs: Inputs, traj: Trajectory) -> Outcome:
    bad = [(k, i) for k, step in enumerate(traj) for i, t in enumerate(step) if not torch.isfinite(t).all()]
    ratio = math.inf if bad else 0.0
    message = (f"non-finite parameters after (step, member) {bad[:5]}" if bad
               else f"all {case.steps * case.megabatch} parameters finite after {case.grad} gradients")
    return Outcome("finite", Metrics(math.nan, math.nan, math.nan, math.nan, ratio), FINITENESS, message)


def _args(inputs: Inputs) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    return inputs.params, inputs.grads

