"""The `mixed` check: flatten=True on a group that mixes layer kinds, as users set it on a whole model.

Judged through the panel's plain Muon (independent of optimizers/: one parameter at a time), through a
variant of it with a group-level flatten decision (the negative control), and through ours."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from cases import Case
from harness.judging.checks import twin_shape
from harness.runner import judged_case, run_case
from harness.targets import load_target
from harness.targets.panel.plain import Plain, PlainMuon

LINEAR = Case(layer="linear", megabatch=2, flatten=True, param_dtype="fp64", compute_dtype="fp64",
              orthogonalizer="newton_schulz", adjust_lr="spectral_norm", nesterov=True, weight_decay=0.1,
              steps=3, grad="gaussian")
CONV = dataclasses.replace(LINEAR, layer="conv2d")


def _mixed(records: list) -> Any:
    (record,) = [r for r in records if r.check == "mixed"]
    return record


class FlattenByFirst(PlainMuon):
    """A plausible defect: the group's flatten is decided once, from its first parameter, so a group led by a
    Linear orthogonalizes its convolutions as their trailing matrices."""

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            declared = group["flatten"]
            group["flatten"] = declared and group["params"][0].ndim > 2
            super().step()
            group["flatten"] = declared


class Stepping(Plain):
    """The panel's plain Muon, stepped by `optimizer` (a PlainMuon subclass that changes only `step`)."""

    optimizer: type[PlainMuon]

    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        built = super().make(params, case)
        built.__class__ = self.optimizer
        return built


class FlattenByFirstTarget(Stepping):
    name, optimizer = "flatten-by-first", FlattenByFirst


class SortedByRank(PlainMuon):
    """A plausible defect: a group's gradients are gathered in order of rank (Linear layers first) and handed
    back in the group's order, so in a mixed group each parameter steps with another's gradient."""

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params = group["params"]
            grads = [params[i].grad for i in sorted(range(len(params)), key=lambda i: params[i].ndim)]
            for p, g in zip(params, grads):
                p.grad = g.reshape(p.shape)
        super().step()


class SortedByRankTarget(Stepping):
    name, optimizer = "sorted-by-rank", SortedByRank


class NoConvolutions(Plain):
    name = "plain-2d-only"

    def unsupported(self, case: Case) -> str | None:
        return "2-D parameters only" if len(case.shape) != 2 else super().unsupported(case)


def test_the_twin_is_the_other_layer_kind_of_the_same_flattened_shape():
    assert twin_shape((8, 4, 3, 3)) == (8, 36)
    assert twin_shape((8, 4, 5)) == (8, 20)
    assert twin_shape((12, 20)) == (12, 20, 1, 1)


@pytest.mark.parametrize("case", [LINEAR, CONV], ids=lambda c: c.layer)
def test_a_per_parameter_implementation_passes_bitwise(case):
    record = _mixed(run_case(case, Plain(), "plain"))
    assert record.status == "pass", record.message
    assert record.ratio == 0.0, record.message  # exact relations in fp64: the same arithmetic either way


def test_an_svd_step_is_judged_within_tolerance_and_still_catches_mixing():
    """The SVD is not odd bit for bit on every CPU (checks.NOT_ODD: MKL's AVX-512 path gave a negated twin a step
    6e-16 off), so with the SVD the mixed relation has an allowance where the polynomial iterations have none; a
    group-level flatten decision still fails it by far (the control)."""
    svd = dataclasses.replace(LINEAR, orthogonalizer="svd")
    assert _mixed(run_case(LINEAR, Plain(), "plain")).tolerance == 0.0
    record = _mixed(run_case(svd, Plain(), "plain"))
    assert record.status == "pass" and record.tolerance > 0, record.message
    wrong = _mixed(run_case(svd, FlattenByFirstTarget(), "flatten-by-first"))
    assert wrong.status == "fail" and wrong.ratio > 1e3, wrong.message


def test_a_group_level_flatten_decision_fails_a_linear_led_group_and_is_diagnosed():
    records = judged_case(LINEAR, FlattenByFirstTarget(), "flatten-by-first")
    record = _mixed(records)
    assert record.status == "fail" and record.ratio > 1e3, record.message
    assert "the members step as alone, their negated 12x20x1x1 twins do not" in record.message
    assert record.diagnosis.startswith("flattened-geometry: mixed fails on the twins alone"), record.diagnosis
    # Alone, the Linear members are right: only the mixed group shows the defect.
    assert all(r.status in ("pass", "skipped") for r in records if r.check != "mixed"), records


def test_the_control_is_right_where_a_convolution_leads_the_group():
    assert _mixed(run_case(CONV, FlattenByFirstTarget(), "flatten-by-first")).status == "pass"


def test_gradients_handed_back_in_another_order_fail_the_members_and_are_diagnosed():
    """A convolution-led group is reordered (its Linear twins sort first); the members get their twins'
    negated gradients."""
    records = judged_case(CONV, SortedByRankTarget(), "sorted-by-rank")
    record = _mixed(records)
    assert record.status == "fail" and "the members: " in record.message, record.message
    assert record.diagnosis.startswith("members-mixed: mixed fails"), record.diagnosis
    assert all(r.status in ("pass", "skipped") for r in records if r.check != "mixed"), records


def test_a_target_that_refuses_the_twin_kind_is_skipped_with_its_reason():
    record = _mixed(run_case(LINEAR, NoConvolutions(), "plain-2d-only"))
    assert record.status == "skipped"
    assert "does not run the twin layer kind here: 2-D parameters only" in record.message


def test_ours_steps_a_mixed_group_as_its_members_alone():
    for case in (LINEAR, dataclasses.replace(CONV, optimizer="normuon", param_dtype="fp32", compute_dtype="bf16",
                                             orthogonalizer="polar_express", nesterov=False)):
        record = _mixed(run_case(case, load_target("ours"), "ours"))
        assert record.status == "pass", record.message


class ConvolutionsCrash(Plain):
    """A target that raises on a 4-D parameter (as DeepSpeed 0.19.8's Muon does) and declares no refusal; it
    also steps at twice the lr, so that a check other than `mixed` fails."""
    name = "conv-crash"

    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        if any(p.ndim == 4 for p in params):
            raise RuntimeError("4-D parameters are not supported")
        return super().make(params, dataclasses.replace(case, lr=2 * case.lr))


def test_a_target_that_raises_on_the_twins_is_an_error_not_a_diagnosis_of_mixing():
    records = judged_case(LINEAR, ConvolutionsCrash(), "conv-crash")
    record = _mixed(records)
    assert record.status == "error" and "4-D parameters are not supported" in record.message
    assert any(r.status == "fail" for r in records)
    assert record.diagnosis.startswith("lr-scale"), record.diagnosis
