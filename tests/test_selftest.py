"""The selftest: its catalog is 20+ distinct loadable defects with rules for their diagnoses; a few
defects run end to end through the runner are all killed and diagnosed with no false alarm; and a
"defect" too small to matter survives, which fails the selftest (its negative control)."""

import dataclasses

import torch

from harness import diagnosis, selftest
from harness.selftest_catalog import BY_NAME, CATALOG, Defect, spec
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
    assert selftest.bitwise_ours(defect.make(), ours, case)
    assert not selftest.can_show(defect, defect.make(), ours, case)
    fp32 = Case.from_id("muon/linear-12x20/mb1/noflat/fp32@fp32/ns/spectral_norm/plain/wd0/steps1/gaussian/seed0")
    assert selftest.can_show(defect, defect.make(), ours, fp32)  # its negative control
