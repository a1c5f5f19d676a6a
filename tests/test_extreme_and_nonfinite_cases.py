"""The written cases of issue 30 items 8 and 9: extreme gradients (near each dtype's range) judged by the FP64
oracle, and a NaN gradient element judged against the documented non-finite policy; each with the real or
constructed implementation it must flag."""

import pytest
import torch

from cases import axes, tier
from harness.runner import run_case
from harness.targets import load_target
from harness.targets.ours import OursMuon

CI = tier("ci")
EXTREME = [c for c in CI if c.grad == axes.EXTREME_GRADIENT]
NONFINITE = [c for c in CI if c.grad == axes.NONFINITE_GRADIENT]


def statuses(case, target):
    return {r.check: r.status for r in run_case(case, target, "test")}


def test_the_ci_tier_writes_both_kinds_for_every_matrix_algorithm():
    for cases in (EXTREME, NONFINITE):
        assert {c.optimizer for c in cases} == {"muon", "normuon", "dion2", "nordion2"}
        assert {c.orthogonalizer for c in cases} >= {"polar_express", "newton_schulz", "svd", axes.GRAM}
    assert {c.param_dtype for c in EXTREME} == {"fp32", "bf16", "fp64"}


@pytest.mark.parametrize("case", [c for c in EXTREME if c.optimizer == "muon"], ids=lambda c: c.id)
def test_ours_steps_extreme_gradients_as_the_oracle(case):
    got = statuses(case, OursMuon())
    assert got["reference"] == "pass" and got["finite"] == "pass", got


def test_torch_optim_muon_loses_the_update_at_extreme_gradients():
    """The finding: torch.optim.Muon's normaliser squares before scaling, so its update vanishes."""
    case = next(c for c in EXTREME if c.optimizer == "muon" and c.compute_dtype == "bf16" and c.orthogonalizer
                == "newton_schulz")
    torch_muon = load_target("torch")
    assert torch_muon.unsupported(case) is None
    assert statuses(case, torch_muon)["reference"] == "fail"


class SkipsNonFinite(OursMuon):
    """A plausible policy the documented one is not: NaN gradient elements replaced by zero."""

    def run(self, params, grads, case):
        return super().run(params, [[torch.nan_to_num(g, nan=0.0) for g in step] for step in grads], case)


class SpreadsNonFinite(OursMuon):
    """A NaN that reaches every member of its megabatch (as a stack-wide norm would spread it)."""

    def run(self, params, grads, case):
        bad = any(not torch.isfinite(g).all() for step in grads for g in step)
        out = super().run(params, grads, case)
        return [[t + float("nan") if bad and k == len(out) - 1 else t for t in step] for k, step in enumerate(out)]


@pytest.mark.parametrize("case", NONFINITE[:4], ids=lambda c: c.id)
def test_the_nonfinite_policy_holds_for_ours_and_flags_a_skip_and_a_spread(case):
    assert statuses(case, OursMuon()) == {"nonfinite": "pass"}
    assert statuses(case, SkipsNonFinite()) == {"nonfinite": "fail"}
    assert statuses(case, SpreadsNonFinite()) == {"nonfinite": "fail"}
