"""A target is judged on its own tier, and every verdict says how much was judged (harness/running/selection.py,
harness/judging/scope.py): a narrow target gets every value and pair of values it supports, a target that
supports every case gets the global tier, a run that judged too little says THIN and exits 1 unless
--allow-thin, and `list --target` says why the rest is unsupported."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

import optimizers
from cases import Case, algorithms, schema, tier
from harness.judging.scope import MIN_JUDGED, judgement
from harness.runner import run_case
from harness.running.selection import target_tier
from harness.targets import load_target
from harness.targets.ours import OursMuon
from reports.records import Record

ROOT = Path(__file__).resolve().parent.parent

TINY = '''
from harness.targets.ours import OursMuon


class Tiny(OursMuon):
    """Ours, seen through an adapter that supports one layer, one format and one schedule."""

    name = "tiny"

    def unsupported(self, case):
        if case.optimizer != "muon" or case.layer != "linear_row" or case.world_size > 1:
            return "tiny: Muon on the 1 x 16 row, one process"
        if case.orthogonalizer != "newton_schulz" or case.param_dtype != "fp32" or case.compute_dtype != "fp32":
            return "tiny: Newton-Schulz, fp32"
        if case.megabatch != 1 or case.grad != "gaussian" or case.adjust_lr != "spectral_norm" or case.steps != 3:
            return "tiny: one parameter, Gaussian gradients, one lr scale, three steps"
        return None


def target():
    return Tiny()
'''


class Narrow(OursMuon):
    name = "narrow"

    def unsupported(self, case: Case) -> str | None:
        if case.optimizer != "muon" or len(case.shape) != 2:
            return "Muon on 2-D weights only"
        return None if case.orthogonalizer == "newton_schulz" and case.compute_dtype == "fp32" else "NS in fp32 only"


class NoRange(Narrow):
    name = "no-range"

    def unsupported(self, case: Case) -> str | None:
        return "no range gradients" if case.grad in ("extreme", "nonfinite") else super().unsupported(case)


def test_a_narrow_target_meets_the_range_and_nonfinite_gradients_in_each_of_its_formats():
    """The covering space has no extreme or non-finite gradients (the global tier's written cases have them, in
    formats Narrow runs none of): its tier adds them, one per format it runs, so its normaliser's overflow shows."""
    assert not [c for c in tier("ci") if c.grad in ("extreme", "nonfinite") and Narrow().unsupported(c) is None]
    own = target_tier("ci", Narrow())
    for kind in ("extreme", "nonfinite"):
        rows = [c for c in own.cases if c.grad == kind]
        formats = {(c.param_dtype, c.compute_dtype, c.orthogonalizer) for c in own.cases if c.world_size == 1}
        assert {(c.param_dtype, c.compute_dtype, c.orthogonalizer) for c in rows} == formats, rows
        assert all(c.world_size == 1 and Narrow().unsupported(c) is None for c in rows)
        assert kind in own.values["grad"]
    assert not [c for c in target_tier("ci", NoRange()).cases if c.grad in ("extreme", "nonfinite")]
    ours = target_tier("ci", OursMuon()).cases  # ours has the written ones: only its defaults rows are added
    assert ours[:len(tier("ci"))] == tuple(tier("ci")) and {c.construct for c in ours[len(tier("ci")):]} == {"defaults"}


def test_a_narrow_target_gets_its_own_covering_tier():
    own = target_tier("ci", Narrow())
    global_supported = [c for c in tier("ci") if Narrow().unsupported(c) is None]
    assert len(own.cases) > 3 * len(global_supported) >= 3, (len(own.cases), len(global_supported))
    assert all(Narrow().unsupported(c) is None for c in own.cases)
    assert list(own.cases[:len(global_supported)]) == global_supported
    assert own.unsupported == len(tier("ci")) - len(global_supported)
    assert own.reasons["Muon on 2-D weights only"] > 0 and own.reasons["NS in fp32 only"] > 0
    assert {"linear", "linear_tall", "linear_row"} == {c.layer for c in own.cases}
    assert {0.0, 1e-4, 0.01, 0.1} == {c.weight_decay for c in own.cases}


def test_a_target_that_supports_every_case_gets_the_global_tier_then_its_defaults_rows():
    own = target_tier("ci", load_target("ours")).cases
    assert list(own[:len(tier("ci"))]) == tier("ci")
    assert [c.optimizer for c in own[len(tier("ci")):]] == [n for n in algorithms.names() for _ in range(2)]
    torch_rows = [c for c in target_tier("ci", load_target("torch")).cases if c.construct == "defaults"]
    assert [c.id for c in torch_rows] == [
        "muon-defaults/linear-12x20/mb2/noflat/fp32@bf16/ns/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0"]


class WrongDefault(OursMuon):
    """Ours, but where the optimizer is built from its defaults NorMuon's beta2 default is 0.5 (the default a
    mutation of optimizers/algorithms/normuon.py changes; every explicit case passes beta2 itself)."""

    name = "wrong-default"

    def options(self, case: Case) -> dict:
        chosen = super().options(case)
        if case.construct == "defaults" and case.optimizer == "normuon":
            record = optimizers.REGISTRY["normuon"]
            chosen["algorithm"] = dataclasses.replace(record, defaults={**record.defaults, "beta2": 0.5})
        return chosen


def test_a_changed_default_fails_the_defaults_case_and_no_explicit_one():
    own = target_tier("ci", OursMuon()).cases
    built = [c for c in own if c.construct == "defaults" and c.optimizer == "normuon"]
    assert [c.layer for c in built] == ["linear", "conv2d"] and all(c.beta2 == 0.95 for c in built)
    assert Case.from_id(built[0].id) == built[0] and built[0].id.startswith("normuon-defaults/")
    explicit = dataclasses.replace(built[0], construct="explicit")
    for target, case, failing in ((OursMuon(), built[0], False), (WrongDefault(), built[0], True),
                                  (WrongDefault(), explicit, False)):
        records = run_case(case, target, target.name)
        assert records and all(r.status in ("pass", "fail", "skipped") for r in records), records
        assert any(r.status == "fail" for r in records) == failing, (target.name, case.id, records)


def test_a_check_that_changes_a_defaults_case_runs_it_explicitly():
    """The bf16 probe runs the case at weight decay 10 and 0: built from the defaults, both would take the
    default 0.1 of torch.optim.Muon and the decay relation failed at 1.4e6 x its allowance on correct code."""
    torch_target = load_target("torch")
    case = next(c for c in target_tier("ci", torch_target).cases if c.construct == "defaults")
    records = run_case(case, torch_target, "torch")
    assert {r.check for r in records} >= {"reference", "probe"}
    assert {r.status for r in records} == {"pass"}, [(r.check, r.message) for r in records if r.status != "pass"]


def test_a_declaration_no_case_can_hold_is_refused_naming_the_target():
    class BadDeclaration(OursMuon):
        name = "bad-declaration"

        def defaults(self, optimizer: str):
            return {"momentum": 1.5} if optimizer == "muon" else None

    with pytest.raises(ValueError, match="target bad-declaration: its declared muon defaults"):
        target_tier("ci", BadDeclaration())


def _record(case: Case, status: str) -> Record:
    return Record(case_id=case.id, check="reference", target="t", backend="cpu", status=status,
                  **schema.column_values(case))


def test_the_scope_line_counts_judged_cases_and_checks():
    own = target_tier("ci", Narrow())
    cases = [c for c in own.cases if c.world_size == 1]
    records = [_record(c, "pass") for c in cases[:-1]] + [_record(cases[-1], "skipped")]
    got = judgement(own, cases, records, ["cpu"], selected=False)
    assert got.scope.startswith(f"judged {len(cases) - 1} cases ({len(cases) - 1} checks) of the {len(own.cases)}")
    assert f"{own.unsupported} of the global ci tier's cases unsupported" in got.scope
    everything = judgement(own, list(own.cases), records, ["cpu"], selected=False)
    assert f"{len(own.cases) - len(cases)} not for backend cpu" in everything.scope


def test_a_value_judged_on_no_case_makes_the_run_thin():
    """Every case of one weight decay skipped: that supported value was never judged."""
    own = target_tier("ci", Narrow())
    cases = [c for c in own.cases if c.world_size == 1]
    records = [_record(c, "skipped" if c.weight_decay == 0.01 else "pass") for c in cases]
    assert "weight_decay=0.01" in judgement(own, cases, records, ["cpu"], selected=False).thin
    assert judgement(own, cases, [_record(c, "pass") for c in cases], ["cpu"], selected=False).thin == ""
    assert judgement(own, cases, records, ["cpu"], selected=True).thin == "", "a --select run is never thin"


def test_a_whole_global_tier_smaller_than_the_minimum_is_not_thin():
    """The gpu tier holds 7 cases: judging all of them is the whole tier, not too little; judging fewer is."""
    own = target_tier("gpu", OursMuon())
    cases = list(own.cases)
    assert len(tier("gpu")) == len(cases) < MIN_JUDGED
    assert judgement(own, cases, [_record(c, "pass") for c in cases], ["cuda"], selected=False).thin == ""
    some = [_record(c, "pass") for c in cases[:-1]] + [_record(cases[-1], "skipped")]
    assert f"fewer than {len(cases)}" in judgement(own, cases, some, ["cuda"], selected=False).thin


def _harness(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    (tmp_path / "tiny.py").write_text(TINY)
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "harness", *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1800)


def test_list_target_prints_its_cases_and_why_the_rest_are_unsupported(tmp_path):
    out = _harness(tmp_path, "list", "--target", "tiny:target")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    ids = [line for line in lines if line.startswith("muon/")]
    assert ids and all("/linear_row-1x16/" in i and "/fp32@fp32/ns/" in i for i in ids)
    assert any("tiny: Muon on the 1 x 16 row, one process" in line for line in lines)
    assert any(line.startswith(f"{len(ids)} cases of the {len(ids)}") for line in lines)


def test_a_thin_run_fails_unless_allowed(tmp_path):
    own_size = len([line for line in _harness(tmp_path, "list", "--target", "tiny:target").stdout.splitlines()
                    if line.startswith("muon/")])
    assert own_size < MIN_JUDGED, "the tiny target must be too narrow to be judged whole"
    thin = _harness(tmp_path, "run", "--target", "tiny:target", "--out", "thin", "--quiet")
    assert thin.returncode == 1, thin.stderr
    assert "THIN:" in thin.stderr and f"fewer than {MIN_JUDGED}" in thin.stderr
    assert "THIN" in (tmp_path / "thin" / "summary.md").read_text().splitlines()[0]
    allowed = _harness(tmp_path, "run", "--target", "tiny:target", "--out", "allowed", "--quiet", "--allow-thin")
    assert allowed.returncode == 0, allowed.stderr
    assert "THIN:" in allowed.stderr
