"""The calibration panel (harness/targets/panel/): independent correct implementations, declared as they are.

Each member is written without optimizers/ and passes the harness where its arithmetic is exact enough to
be judged tightly (fp64, fp32); a member misdeclaring what it runs fails. The whole CI tier at fp32/fp64 is
proven by stored runs (README, "Calibration on a panel"); here a sample per member and the negative
controls."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from cases import Case, tier
from harness.policy.calibrate import coefficients
from harness.policy.calibrate import panel as calibration
from harness.runner import run_case
from harness.targets import load_target
from harness.targets.panel import PANEL
from harness.targets.panel.plain import Plain, gram_iteration, polar, polynomial
from oracles import Orthogonalizer

PANEL_DIR = Path(__file__).resolve().parents[1] / "harness" / "targets" / "panel"

SAMPLE = (
    "muon/linear-12x20/mb2/noflat/fp64@fp64/ns/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0",
    "muon/conv2d-8x4x3x3/mb2/flat/fp32@fp32/pe/rms_norm/plain/wd0.1/steps3/gaussian/seed0",
    "normuon/conv1d-8x4x5/mb2/noflat/fp64@fp32/svd/spectral_norm/nesterov/wd0/steps3/lowrank/seed0",
    "muon/linear_tall-24x6/mb1/noflat/fp32@fp32/gns/none/nesterov/wd0.1/steps3/gaussian/seed0",
    "normuon/linear_row-1x16/mb3/noflat/fp32@fp32/ns/rms_norm/plain/wd0/steps3/huge/seed0",
)


def test_no_panel_module_imports_optimizers():
    for path in sorted(PANEL_DIR.glob("*.py")):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] == "optimizers"], path.name


@pytest.mark.parametrize("member", [m.spec for m in PANEL])
def test_each_member_passes_a_sample_of_exact_cases(member):
    target = load_target(member)
    judged = 0
    for case_id in SAMPLE:
        case = Case.from_id(case_id)
        if target.unsupported(case) is not None:
            continue
        records = run_case(case, target, member)
        judged += 1
        assert all(r.status == "pass" for r in records), [(r.check, r.status, r.ratio, r.message) for r in records]
    assert judged or member == "torch"  # torch.optim.Muon computes in bf16 only


class Misdeclared(Plain):
    """Runs Jiacheng You's quintics and declares the case's own schedule (Keller Jordan's)."""

    def __init__(self) -> None:
        super().__init__("fused", "param", "you")

    def conventions(self, case):
        return dataclasses.replace(super().conventions(case),
                                   orthogonalizer=Orthogonalizer.named(case.orthogonalizer))


def test_a_member_that_misdeclares_its_schedule_fails():
    """Negative control: the same implementation declaring what it does not run is flagged; declared as it
    is (You's quintics), it passes."""
    case = Case.from_id(SAMPLE[0].replace("fp64@fp64", "fp32@fp32"))
    got = {r.check: r.status for r in run_case(case, Misdeclared(), "misdeclared")}
    assert got["reference"] == "fail", got
    honest = {r.check: r.status for r in run_case(case, Plain("fused", "param", "you"), "you")}
    assert set(honest.values()) == {"pass"}, honest


def test_the_iterations_are_the_declared_maps_in_fp64():
    """The Gram iteration and both polynomial forms agree with each other to fp64 rounding, and the SVD
    member is the polar factor."""
    g = torch.Generator().manual_seed(0)
    u = torch.randn(3, 6, 10, generator=g, dtype=torch.float64)
    for name in ("newton_schulz", "polar_express"):
        spec = Orthogonalizer.named(name)
        fused, expanded = polynomial(u, spec, "fused"), polynomial(u, spec, "expanded")
        gram = gram_iteration(u, dataclasses.replace(spec, iteration="gram"))
        assert torch.allclose(fused, expanded, atol=1e-12) and torch.allclose(fused, gram, atol=1e-10)
    o = polar(u, Orthogonalizer.named("svd", compute_dtype="fp64"))
    assert torch.allclose(o @ o.mT, torch.eye(6, dtype=torch.float64).expand(3, 6, 6), atol=1e-12)
    assert np.allclose(np.linalg.svd(o.numpy(), compute_uv=False), 1.0)


def test_the_calibration_panel_is_ours_and_every_member():
    assert calibration.MEMBERS == ("ours", *(m.spec for m in PANEL))
    you = calibration.build("harness.targets.panel:expanded", "you", 1e-8)
    assert isinstance(you, Plain) and (you.form, you.schedule, you.eps) == ("expanded", "you", 1e-8)
    assert calibration.build("torch", "you") is None
    torch_member = load_target("torch")
    buggy = Case.from_id("muon/linear-12x20/mb1/noflat/bf16@bf16/ns/spectral_norm/plain/wd0/steps3/gaussian/seed0")
    assert torch_member.unsupported(buggy) is None and not calibration.runs_case("torch", torch_member, buggy)
    wide = calibration.build("harness.targets.panel:textbook_fp32_momentum")
    assert not calibration.runs_case("harness.targets.panel:textbook_fp32_momentum", wide,
                                     Case.from_id(SAMPLE[1]))  # fp32 parameters: its twin runs the same


OWN_ROW = "dion2-f1-ef0.9/conv1d-8x4x5/mb3/flat/fp64@fp64/ns/none/plain/wd0.1_lr0.05/steps3/tiny/seed0"
"""A row of the expanded member's own CI tier that the global tier lacks: the calibration measured only the global
tier's cases, its key's allowance missed this run (the member failed `reference` at 1.007x), and now it does not."""


def test_the_calibration_measures_each_member_on_its_own_tier_rows():
    member = "harness.targets.panel:expanded"
    own = calibration.own_cases(member, "ci")
    shared = set(map(calibration.single, tier("ci")))
    assert own and not shared & set(own) and Case.from_id(OWN_ROW) in own
    target = load_target(member)
    assert all(target.unsupported(c) is None for c in own)
    # ours supports every case: its own rows are those built from its documented defaults
    assert {c.construct for c in calibration.own_cases("ours", "ci")} == {"defaults"}
    measured = coefficients.runs([], members=(member,), own={member: own})
    assert Case.from_id(OWN_ROW) in {case for case, _, _ in measured}
    assert coefficients.runs([], members=(member,)) == []  # without its own rows the member measures nothing here
    got = {r.check: r for r in run_case(Case.from_id(OWN_ROW), target, "expanded")}
    assert got["reference"].status == "pass", got["reference"]


FRACTION1 = "nordion2-f1-ef0.9/linear-12x20/mb2/flat/fp64@fp64/ns/none/plain/wd0.01/steps3/gaussian/seed0"


class OffEquivalent(Plain):
    """Its NorMuon path runs a 1% larger lr: NorDion2 at fraction 1 is then not its NorMuon."""

    def make(self, params, case):
        return super().make(params, dataclasses.replace(case, lr=case.lr * 1.01) if case.optimizer == "normuon" else case)


def test_fraction1_is_bitwise_only_where_the_target_claims_one_arithmetic():
    """A member whose NorDion2 and NorMuon are two code paths rounds them 3e-16 apart in fp64: within the case's
    tolerance, not a failure (it was: `fraction1` demanded bitwise agreement of every target claiming
    `exact_relations`, a claim about megabatches). Negative control: a 1% lr difference between the paths fails."""
    case = Case.from_id(FRACTION1)
    member = load_target("harness.targets.panel:expanded")
    assert member.exact_relations and not member.exact_equivalents
    got = {r.check: r for r in run_case(case, member, "expanded")}
    assert got["fraction1"].status == "pass" and "bitwise" not in got["fraction1"].tolerance_source, got["fraction1"]
    wrong = {r.check: r for r in run_case(case, OffEquivalent(), "off")}
    assert wrong["fraction1"].status == "fail" and wrong["fraction1"].ratio > 10, wrong["fraction1"]
    assert load_target("ours").exact_equivalents
