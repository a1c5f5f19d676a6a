"""Negative controls: each deliberately wrong target must be flagged, by the check meant to catch it,
and a correct target must pass those same cases."""

import pytest
from failing_cases import failed_cases

from cases import Case, ci_cases
from harness.runner import run_case
from harness.targets import load_target

CONV_MB3 = "muon/conv2d-8x4x3x3/mb3/flat/fp32@fp32/{orth}/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0"


def statuses(target, case_id):
    records = run_case(Case.from_id(case_id), load_target(target), target)
    return {r.check: r for r in records}


@pytest.mark.parametrize("orth", ["ns", "pe", "svd"])
def test_layer_mixing_megabatch_is_flagged(orth):
    got = statuses("control-layer-mixing", CONV_MB3.format(orth=orth))
    assert got["reference"].status == "fail" and got["reference"].ratio > 10
    assert got["megabatch"].status == "fail"
    assert all(r.status == "pass" for r in statuses("ours", CONV_MB3.format(orth=orth)).values())


def test_layer_mixing_is_invisible_at_megabatch_one():
    """The bug needs a stack: with N=1 the control is correct, so the harness must not cry wolf."""
    got = statuses("control-layer-mixing", CONV_MB3.format(orth="pe").replace("mb3", "mb1"))
    assert all(r.status == "pass" for r in got.values())


@pytest.mark.parametrize("layer", ["conv2d-8x4x3x3", "conv3d-6x3x2x3x3", "conv1d-8x4x5"])
def test_lr_from_last_two_dims_is_flagged(layer):
    case_id = CONV_MB3.format(orth="pe").replace("conv2d-8x4x3x3", layer)
    got = statuses("control-lr-last-two-dims", case_id)
    assert got["reference"].status == "fail"


def test_stack_norm_is_flagged_by_megabatch_invariance():
    got = statuses("control-stack-norm", CONV_MB3.format(orth="ns"))
    assert got["megabatch"].status == "fail" and got["reference"].status == "fail"


@pytest.mark.parametrize("control", ["control-layer-mixing", "control-lr-last-two-dims", "control-stack-norm"])
def test_each_control_fails_many_ci_cases(control):
    failed, run = failed_cases(ci_cases(), control, enough=5)
    assert failed == 5, f"{control} failed only {failed} of the {run} CI cases"
