"""The calibrators (harness/policy/calibrate/): what they measure and how they fold tables together."""

from __future__ import annotations

import pytest

from harness.policy import tables
from harness.policy.calibrate import coefficients, drift, folded
from harness.policy.keys import Key

K1, K2, STALE = (Key.parse(f"muon/fp32@bf16/{s}/well") for s in ("poly-mild", "poly-steep", "svd"))


def table(entries, commands, kind="coefficient", conditions=None, **counts):
    return tables.Table(kind, "test", {"commands": commands, "date": "2026-01-01", "torch": "t", "device": "d0",
                                       **counts}, entries, conditions or {}, ("ours",))


def entry(worst, n, case):
    return tables.Entry(n, {"c": worst}, {"c": worst / 2}, {"c": case})


def test_folding_keeps_each_keys_worst_sums_counts_and_drops_stale_keys(tmp_path):
    earlier = tmp_path / "a.json"
    tables.write(table({K1: entry(0.5, 3, "a1"), STALE: entry(9.0, 1, "s")}, ["A"], cases=3, runs=4, seconds=1.0),
                 earlier)
    mine = table({K1: entry(0.2, 10, "m1"), K2: entry(0.1, 1, "m2")}, ["B"], cases=1, runs=2, seconds=2.0)
    got = folded(mine, [earlier], drop="/svd/")
    assert got.entries[K1] == tables.Entry(13, {"c": 0.5}, {"c": 0.1}, {"c": "a1"})
    assert got.entries[K2] == mine.entries[K2] and STALE not in got.entries
    assert got.provenance["commands"] == ["B", "A"]
    assert (got.provenance["cases"], got.provenance["runs"], got.provenance["seconds"]) == (4, 6, 3.0)
    merge_only = folded(table({}, ["C"]), [earlier], drop=None, runs_made=False)
    assert merge_only.provenance["commands"] == ["A"] and merge_only.provenance["device"] == "d0"


def test_folding_refuses_a_table_of_another_kind_or_conditions(tmp_path):
    other = tmp_path / "n.json"
    tables.write(table({}, ["N"], kind="noise", conditions={"layers": ["linear"]}), other)
    with pytest.raises(ValueError, match="noise table"):
        folded(table({}, ["B"]), [other], None)
    with pytest.raises(ValueError, match="conditions"):
        folded(table({}, ["B"], kind="noise", conditions={"layers": ["conv1d"]}), [other], None)


def test_drawn_cases_are_the_property_tests_and_reproducible():
    from cases.strategies import cases as strategy  # noqa: F401  (the strategy --drawn samples)
    first = coefficients.drawn(12, 5, ("dion2", "nordion2"))
    assert first == coefficients.drawn(12, 5, ("dion2", "nordion2")) and len(first) >= 6
    assert {c.optimizer for c in first} <= {"dion2", "nordion2"} and len({c.seed for c in first}) > 3
    assert coefficients.drawn(12, 6, ("dion2", "nordion2")) != first


def test_a_drift_worst_counts_the_correct_implementations_only():
    key = Key.parse("muon/fp32@bf16/newton_schulz/gaussian/linear/noflat")
    results = [("ours", key, {"drift": 0.01}), ("ours", key, {"drift": -0.02}), ("plain", key, {"drift": 0.03}),
               ("defect", key, {"drift": 0.5})]
    got = drift.entries(results, ["ours", "plain"])[key]
    assert got.worst == {"drift": 0.03} and got.n == 3
    assert got.by["defect"]["drift"]["worst"] == 0.5 and got.by["ours"]["drift"]["mean"] == pytest.approx(-0.005)
