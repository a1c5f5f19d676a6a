"""The selftest: its catalog is 20+ distinct loadable defects with rules for their diagnoses; a few
defects run end to end through the runner are all killed and diagnosed with no false alarm; and a
"defect" too small to matter survives, which fails the selftest (its negative control)."""

import dataclasses

import torch

from harness.apps import selftest
from harness.apps.selftest_catalog import BY_NAME, CATALOG, Defect, spec
from harness.judging import diagnosis
from harness.targets import load_target
from harness.targets.controls import Control


def test_catalog_is_large_distinct_and_loadable():
    assert len(CATALOG) >= 20 and len(BY_NAME) == len(CATALOG)
    for d in CATALOG:
        target = load_target(spec(d))
        assert target.name == d.name or target.name.endswith(d.name), (d.name, target.name)
        assert d.expected in diagnosis.LABELS and d.source
    assert {d.distributed for d in CATALOG} == {False, True}


def test_defects_are_killed_and_diagnosed_without_false_alarms():
    chosen = tuple(BY_NAME[n] for n in ("wd-after-update", "lr-spectral-inverted", "flatten-4d-only"))
    outcome = selftest.selftest(limit=2, defects=chosen)
    assert all(len(v) == 2 for v in outcome.verdicts.values()), outcome.verdicts
    assert any(v.bf16 for vs in outcome.verdicts.values() for v in vs)
    assert outcome.passed and not outcome.survivors, selftest.render(outcome)
    assert all(v.diagnosed for vs in outcome.verdicts.values() for v in vs), selftest.render(outcome)
    text = selftest.render(outcome)
    assert "kill rate: 6/6" in text and "selftest PASSED" in text


def _nudged(algorithm):
    """Moves one element of the parameter by one ulp after each step: changes bits, nothing a check
    may flag (within the storage rounding every tolerance allows)."""
    apply = algorithm.apply

    def nudged(x, update, state, group, scale):
        apply(x, update, state, group, scale)
        first = x.view(-1)[:1]
        first.copy_(torch.nextafter(first, torch.full_like(first, float("inf"))))
    return dataclasses.replace(algorithm, apply=nudged)


def test_a_surviving_defect_fails_the_selftest():
    harmless = Defect("nudge", lambda: Control("nudge", _nudged), "lr-scale", lambda c: c.compute_dtype == "fp32" and c.param_dtype == "fp32",
                      "negative control of the selftest itself")
    outcome = selftest.selftest(limit=1, defects=(harmless,))
    assert outcome.survivors and not outcome.passed
    assert "SURVIVED nudge" in selftest.render(outcome)


def test_a_case_where_the_defect_runs_bitwise_ours_is_not_one_where_it_can_show():
    """Momentum rounded to bf16, one plain step, bf16 compute: the orthogonalization rounds U to bf16
    anyway, so no check of any harness can see it there, though in fp64 it changes the update."""
    from cases import Case
    case = Case.from_id("muon/linear-12x20/mb1/noflat/fp32@bf16/ns/spectral_norm/plain/wd0/steps1/gaussian/seed0")
    defect, ours = BY_NAME["momentum-bf16"], load_target("ours")
    assert selftest.effect(defect.make(), ours, case) > selftest.SHOWS
    assert selftest.bitwise(defect.make(), ours, case)
    assert not selftest.can_show(defect, defect.make(), ours, case)
    fp32 = Case.from_id("muon/linear-12x20/mb1/noflat/fp32@fp32/ns/spectral_norm/plain/wd0/steps1/gaussian/seed0")
    assert selftest.can_show(defect, defect.make(), ours, fp32)  # its negative control


def test_a_defect_the_rounding_absorbs_is_bitwise_its_baseline_not_ours():
    """eps = 1e-2 added to ||G|| ~ 15 computed in bf16 (spacing 0.0625 there) vanishes: the defect's
    run is bitwise its own iteration without the defect, though not bitwise ours (another kernel)."""
    from cases import Case
    case = Case.from_id("muon/linear_tall-24x6/mb2/noflat/bf16@bf16/ns/none/plain/wd0.1/steps3/gaussian/seed0")
    defect, ours = BY_NAME["normaliser-eps-large"], load_target("ours")
    target, baseline = defect.make(), defect.baseline()
    assert selftest.effect(target, ours, case) > selftest.SHOWS and not selftest.bitwise(target, ours, case)
    assert selftest.bitwise(target, baseline, case) and selftest.why_hidden(defect, target, ours, case) == ""
    # its negative control: fp32 compute resolves the eps, the runs differ
    fp32 = dataclasses.replace(case, param_dtype="fp32", compute_dtype="fp32")
    assert not selftest.bitwise(target, baseline, fp32) and selftest.can_show(defect, target, ours, fp32)


def test_visibility_shows_only_beyond_allowance_plus_noise():
    assert selftest.Visibility("norm", 0.05, 0.03, 0.01).shows
    assert not selftest.Visibility("norm", 0.035, 0.03, 0.01).shows
    assert not selftest.Visibility("norm", 0.04, 0.03, 0.01).shows


def test_a_defect_hidden_by_noise_is_passed_over_with_its_numbers_and_a_visible_one_is_not():
    """Polar Express's first coefficient off in its 4th digit under tiny gradients (eps dominates the
    normaliser, so the polynomial is linear: the typo scales the update by 5e-4) with bf16 compute:
    every check's allowance exceeds its effect; an lr scale inverted on the same case is not hidden."""
    from cases import Case
    case = Case.from_id("muon/linear_tall-24x6/mb1/noflat/fp32@bf16/pe/spectral_norm/plain/wd0.1/steps3/tiny/seed0")
    ours = load_target("ours")
    typo = BY_NAME["pe-coefficient-typo"]
    why = selftest.why_hidden(typo, typo.make(), ours, case)
    assert why and why.startswith("effect vs allowed + noise: reference ")
    seen = selftest.visibility(typo.make(), ours, case)
    assert {"reference", "norm", "sv_mean", "sv_spread"} <= {v.check for v in seen} and not any(v.shows for v in seen)
    inverted = BY_NAME["lr-spectral-inverted"]
    assert selftest.why_hidden(inverted, inverted.make(), ours, case) is None
    assert any(v.shows for v in selftest.visibility(inverted.make(), ours, case))


def test_the_report_prints_the_cases_hidden_by_noise():
    outcome = selftest.Outcome({}, {}, 0.0, {"pe-coefficient-typo": {"some/case": "effect vs allowed + noise: x"}})
    assert "HIDDEN BY NOISE pe-coefficient-typo: some/case (effect vs allowed + noise: x)" in selftest.render(outcome)


def test_torch_is_judged_for_false_alarms_outside_its_known_finding_only():
    """torch.optim.Muon's bf16 momentum buffer bug (bf16 parameters, no Nesterov, 2+ steps) is a
    finding, not a false alarm: the selftest leaves those cases out of torch's false alarms; the
    Nesterov twin, where torch is correct, stays in."""
    from cases import Case
    from harness.runner import run_case
    case = Case.from_id("muon/linear_row-1x16/mb2/noflat/bf16@bf16/ns/rms_norm/plain/wd0/steps3/gaussian/seed0")
    assert any(r.failing for r in run_case(case, load_target("torch"), "torch"))  # the finding is real
    assert selftest.CORRECT["torch"](case) and selftest.false_alarms([case]) == {"ours": [], "torch": []}
    assert selftest.CORRECT["torch"](dataclasses.replace(case, nesterov=True)) is None
