"""Conventions.decay_dtype: weight decay folded into an update held in bf16 (dtensor-muon adds wd X into
its bf16 orthogonalized update in place), so the decay term is rounded to bf16 before it reaches an fp32
parameter. The `probe` relation (decayed run = declared decay + the undecayed run's step, to storage
rounding) failed such a correct run at 670-5700 x; declared, it passes, undeclared it fails, a folded decay
with the wrong lr still fails, and ours (decay in the parameter) is judged as before. Without the peer: a
small torch Muon that steps as dtensor-muon does (the peer itself: tests/test_peers.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from cases import Case
from harness.judging.checks import reference
from harness.judging.robust_checks import probe_check
from harness.running.inputs import make_inputs
from harness.targets.base import OptimizerTarget
from harness.targets.ours import OursMuon
from oracles import Conventions, Orthogonalizer
from oracles.coefficients import newton_schulz_schedule

CASES = ["muon/linear-12x20/mb1/noflat/fp32@bf16/ns/spectral_norm/plain/wd0/steps1/gaussian/seed0",
         "muon/linear-12x20/mb2/noflat/fp32@bf16/ns/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0"]
"""The first is a CI case dtensor-muon failed `probe` on at 2415."""


class FoldedMuon(OptimizerTarget):
    """fp32 parameters, fp32 sum momentum, Keller Jordan's quintic in bf16 from U / (||U|| + 1e-7), and
    X <- X - lr s (O + c wd X) with O + c wd X held in bf16 (c = 1: the adjusted lr on the decay, as
    declared; `wrong_decay_lr`: c = 1 / s, the base lr, a defect). Declares `decay_dtype`."""

    name = "folded-muon"

    def __init__(self, decay_dtype: str = "bf16", wrong_decay_lr: bool = False) -> None:
        self.decay_dtype, self.wrong_decay_lr = decay_dtype, wrong_decay_lr

    def conventions(self, case: Case) -> Conventions:
        return Conventions(orthogonalizer=Orthogonalizer.named("newton_schulz"), lr_scale=case.adjust_lr,
                           lr_dims="last_two", compute_dtype="bf16", state_dtype="fp32",
                           weight_decay_lr="adjusted", decay_dtype=self.decay_dtype)

    def make(self, params, case):
        return _FoldedSGD(params, case, self.wrong_decay_lr)


class _FoldedSGD(torch.optim.Optimizer):
    def __init__(self, params, case: Case, wrong_decay_lr: bool) -> None:
        super().__init__(params, {})
        self.case, self.wrong_decay_lr = case, wrong_decay_lr

    @torch.no_grad()
    def step(self, closure=None):
        case = self.case
        for p in self.param_groups[0]["params"]:
            m = self.state[p].setdefault("m", torch.zeros_like(p))
            m.mul_(case.momentum).add_(p.grad)
            u = p.grad + case.momentum * m if case.nesterov else m
            x = u.bfloat16()
            x = x / (x.norm() + 1e-7)
            for a, b, c in newton_schulz_schedule(5):
                s = x @ x.mT
                x = a * x + (b * s + c * s @ s) @ x
            scale = math.sqrt(p.shape[0] / p.shape[1])
            step = case.lr * scale
            if case.weight_decay:
                factor = 1.0 / scale if self.wrong_decay_lr else 1.0  # the base lr on the decay: a defect
                x.add_(p, alpha=factor * case.weight_decay)  # in place into the bf16 update
            p.add_(x, alpha=-step)


@pytest.mark.parametrize("case_id", CASES)
def test_probe_passes_decay_folded_in_bf16_when_declared_and_fails_undeclared(case_id):
    case = Case.from_id(case_id)
    inputs = make_inputs(case)
    declared, undeclared = FoldedMuon("bf16"), FoldedMuon("fp64")
    traj = declared.run(inputs.params, inputs.grads, case)
    got = probe_check(case, declared, inputs, traj)
    assert got.status == "pass", got.message
    bad = probe_check(case, undeclared, inputs, traj)
    assert bad.status == "fail" and bad.metrics.ratio > 100, bad.message
    assert reference(case, declared, inputs, traj).status == "pass"


def test_probe_still_sees_a_folded_decay_with_the_wrong_lr():
    """The relation allows either bf16 neighbour of O + wd X per entry; a decay with the base lr instead
    of the declared adjusted one moves it by tens of those ulps at the probe's wd."""
    case = Case.from_id(CASES[0])
    inputs = make_inputs(case)
    wrong = FoldedMuon("bf16", wrong_decay_lr=True)
    assert probe_check(case, wrong, inputs, wrong.run(inputs.params, inputs.grads, case)).status == "fail"


@pytest.mark.parametrize("case_id", CASES)
def test_ours_decays_in_the_parameter_and_is_judged_as_before(case_id):
    """Ours declares the default (decay applied to the parameter); folded-decay judging would not fit it."""
    case = Case.from_id(case_id)
    ours = OursMuon()
    assert ours.conventions(case).decay_dtype == "fp64"
    inputs = make_inputs(case)
    traj = ours.run(inputs.params, inputs.grads, case)
    assert probe_check(case, ours, inputs, traj).status == "pass"
    assert reference(case, ours, inputs, traj).status == "pass"


class _FoldedClaim(OursMuon):
    def conventions(self, case):
        return dataclasses.replace(super().conventions(case), decay_dtype="bf16", weight_decay_lr="adjusted")


def test_a_folding_claim_is_judged_not_trusted():
    """Ours decays exactly (no bf16 rounding of the decay term) with the base lr; declared as folding with the
    adjusted lr it fails the probe: the convention says what the decay term is rounded to, and the relation
    holds the run to it rather than widening what it accepts."""
    case = Case.from_id(CASES[0])
    inputs = make_inputs(case)
    claim = _FoldedClaim()
    assert probe_check(case, claim, inputs, claim.run(inputs.params, inputs.grads, case)).status == "fail"
