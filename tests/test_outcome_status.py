"""A check built on another (scale on reference; layout and fraction1 on a relation) keeps that
check's status: an ill-posed or unjudgeable comparison is skipped/unsupported, never a NaN "fail"."""

from __future__ import annotations

import copy
import dataclasses

from cases import Case
from harness.judging import checks, distributed_checks
from harness.running.inputs import make_inputs
from harness.targets.ours import OursMuon
from oracles import Conventions

ILL_POSED_ACROSS_KERNELS = "muon/linear-12x20/mb2/noflat/fp32@bf16/pe/none/nesterov/wd0.1/steps3/gaussian/seed0"
"""bf16 Polar Express on a Gaussian direction: derived rtol ~0.33 > ILL_POSED_RTOL, so two runs with
different kernels cannot be compared (the relation is skipped as ill-posed)."""


def _inexact() -> OursMuon:
    """Ours as judged where its kernels differ between the two runs of a relation (as on cuda)."""
    target = copy.copy(OursMuon())
    target.exact_relations = False
    return target


def test_layout_keeps_a_skipped_relation_skipped():
    case = Case.from_id(ILL_POSED_ACROSS_KERNELS + "/replicated/ws2")
    target, inputs = _inexact(), make_inputs(case)
    traj = target.run(inputs.params, inputs.grads, case)
    out = distributed_checks.layout(case, target, inputs, [traj, traj])
    assert out.status == "skipped", (out.status, out.message)
    assert "ill-posed" in out.message and out.message.startswith("replicated on 2 ranks vs one process")


class _DeclaresSvdInBf16(OursMuon):
    """Ours declaring an arithmetic the policy has no measurement for (an fp64 SVD in bf16)."""

    def conventions(self, case: Case) -> Conventions:
        return dataclasses.replace(super().conventions(case), compute_dtype="bf16")


def test_scale_keeps_an_unsupported_reference_unsupported():
    case = Case.from_id("muon/linear-12x20/mb1/noflat/fp64@fp64/svd/none/plain/wd0/steps1/gaussian/seed0")
    target, inputs = _DeclaresSvdInBf16(), make_inputs(case)
    out = checks.scale(case, target, inputs, target.run(inputs.params, inputs.grads, case))
    assert (out.check, out.status) == ("scale", "unsupported"), (out.status, out.message)
    assert out.message.startswith("gradients x 1024: the tolerance policy has no entry")


class _DeclaresFp16(OursMuon):
    def conventions(self, case: Case) -> Conventions:
        return dataclasses.replace(super().conventions(case), compute_dtype="fp16")


def test_scale_is_not_judged_where_the_declared_format_cannot_hold_the_scaled_run():
    case = Case.from_id("muon/linear-12x20/mb1/noflat/fp32@bf16/pe/none/nesterov/wd0.1/steps3/gaussian/seed0")
    target, inputs = _DeclaresFp16(), make_inputs(case)
    out = checks.scale(case, target, inputs, target.run(inputs.params, inputs.grads, case))
    assert (out.check, out.status) == ("scale", "skipped") and "overflow the declared fp16" in out.message
