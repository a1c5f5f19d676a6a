"""AdamW, the elementwise fallback, judged by the harness at betas below one half: every tier case has betas of
0.9 and more, where `1 - beta` and `1 % beta` are the same float (fmod is exact there), so a bias correction or
moment weight written with the wrong operator survived every case (the mutation run, issue 31)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import optimizers
from cases import Case
from harness.runner import run_case
from harness.targets import load_target
from harness.targets.ours import OursMuon


@pytest.mark.parametrize("layer, dtype, decay", [("bias", "fp64", 0.0), ("embedding", "fp32", 0.1)])
def test_adamw_at_small_betas_matches_its_reference(layer, dtype, decay):
    case = Case(layer=layer, megabatch=2, flatten=False, param_dtype=dtype, compute_dtype=dtype, orthogonalizer="none",
                adjust_lr="none", nesterov=False, weight_decay=decay, steps=3, grad="gaussian", optimizer="adamw",
                momentum=0.3, beta2=0.4)
    assert case.id.startswith("adamw-b0.4/") and "plain_mu0.3" in case.id
    records = run_case(case, load_target("ours"), "ours")
    assert {r.check for r in records} >= {"reference", "megabatch"}
    assert all(r.status == "pass" for r in records), [(r.check, r.status, r.message) for r in records]


class WrongWeight(OursMuon):
    """Ours, with AdamW's first-moment weight written 1 % beta1 (the same float as 1 - beta1 at 0.9)."""

    name = "adamw-wrong-weight"

    def options(self, case: Case) -> dict:
        def moments(grad, state, group):
            beta1, beta2 = group["betas"]
            state["step"] += 1
            state["exp_avg"].lerp_(grad, 1.0 % beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
            return state["exp_avg"]
        return dict(super().options(case), algorithm=dataclasses.replace(optimizers.ADAMW, direction=moments))


@pytest.mark.parametrize("beta1, failing", [(0.3, True), (0.9, False)])
def test_a_moment_weight_written_with_the_wrong_operator_fails_only_at_small_betas(beta1, failing):
    """Negative control: the wrong weight fails the reference at beta1 0.3 and passes at 0.9 (why no tier case saw
    it)."""
    case = Case(layer="bias", megabatch=1, flatten=False, param_dtype="fp64", compute_dtype="fp64",
                orthogonalizer="none", adjust_lr="none", nesterov=False, weight_decay=0.0, steps=3, grad="gaussian",
                optimizer="adamw", momentum=beta1, beta2=0.4)
    got = {r.check: r.status for r in run_case(case, WrongWeight(), "adamw-wrong-weight")}
    assert (got["reference"] == "fail") == failing, got


@pytest.mark.parametrize("betas", [(0.9, 0.95, 0.99), (0.9,), (1.0, 0.95), (0.9, 1.0), (-0.1, 0.95), 0.9])
def test_betas_that_are_not_a_pair_in_the_unit_interval_are_refused(betas):
    """A pair, each in [0, 1): a third beta, a beta of 1 (no averaging: the bias correction divides by zero) or a
    negative one is a ValueError naming betas, before anything steps."""
    p = torch.nn.Parameter(torch.randn(16))
    with pytest.raises(ValueError, match="betas"):
        optimizers.Muon([p], algorithm="adamw", betas=betas)


def test_a_negative_adamw_eps_and_a_negative_second_moment_are_refused():
    """adamw_eps >= 0 at construction; a checkpoint whose exp_avg_sq holds a negative value (its square root
    would be NaN) is refused on load, the optimizer untouched."""
    p = torch.nn.Parameter(torch.randn(16))
    with pytest.raises(ValueError, match="adamw_eps"):
        optimizers.Muon([p], algorithm="adamw", adamw_eps=-1e-3)
    opt = optimizers.Muon([p], algorithm="adamw")
    p.grad = torch.randn(16)
    opt.step()
    saved = opt.state_dict()
    bad = copy.deepcopy(saved)
    next(iter(bad["state"].values()))["exp_avg_sq"][0] = -1.0
    with pytest.raises(ValueError, match="exp_avg_sq"):
        opt.load_state_dict(bad)
    assert torch.equal(next(iter(opt.state_dict()["state"].values()))["exp_avg_sq"],
                       next(iter(saved["state"].values()))["exp_avg_sq"])


def test_a_scalar_parameter_steps_as_adamw():
    """AdamW takes parameters of any rank, a 0-D scalar (a learned temperature) too."""
    p = torch.nn.Parameter(torch.tensor(0.5))
    p.grad = torch.tensor(0.25)
    optimizers.Muon([p], algorithm="adamw", lr=0.1).step()
    assert p.item() != 0.5
