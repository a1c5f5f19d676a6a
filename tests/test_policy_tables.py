"""The one policy package: one key scheme, one table format and loader, one safety rule.

The four measured tables were converted from the three formats of commit 391bf98; every number of the old
files is found in the new ones (read from git), with their provenance."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
from pathlib import Path

import pytest

from cases import Case
from harness.policy import allowance, keys, noise, tables, tolerance
from harness.policy.keys import Key
from harness.targets.ours import OursMuon

ROOT = Path(__file__).resolve().parent.parent
OLD = "391bf98"
CONVERTED = "7826f5a"
"""The commit that converted the four tables to the one format, with OLD's numbers."""
"""The commit before the one policy package: the tables' old formats."""


# ---- keys ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["muon/fp32@bf16/poly-steep/well", "dion2/bf16@bf16/poly-mild:you/rank-1",
                                  "muon/fp32@bf16/polar_express:pe102/tiny:eps1e-08",
                                  "normuon/fp32@bf16/newton_schulz/gaussian/linear_tall/noflat"])
def test_a_key_has_one_string_form_and_parses_back(text):
    assert str(Key.parse(text)) == text and Key.parse(str(Key.parse(text))) == Key.parse(text)


@pytest.mark.parametrize("text, what", [("muon fp32@bf16/poly-steep/well", "fields"), ("muon/fp32/ns/well", "param@compute"),
                                        ("muon/fp32@bf16/ns/gaussian/linear", "fields"),
                                        ("muon/fp32@bf16/ns/gaussian/linear/sideways", "view"),
                                        ("muon/fp32@bf16//gaussian", "required")])
def test_a_malformed_key_is_refused_naming_what_is_wrong(text, what):
    with pytest.raises(ValueError, match=what):
        Key.parse(text)


def test_the_three_kinds_of_key_come_from_one_scheme():
    case = Case.from_id("muon/conv2d-8x4x3x3/mb1/flat/fp32@bf16/ns/spectral_norm/nesterov/wd0/steps8/gaussian/seed0")
    conv = OursMuon().conventions(case)
    assert str(keys.coefficient_key(case, conv, "well")) == "muon/fp32@bf16/poly-mild/well"
    assert str(keys.noise_key(case, "bf16")) == "muon/fp32@bf16/newton_schulz/gaussian"
    assert str(keys.drift_key(case, "bf16")) == "muon/fp32@bf16/newton_schulz/gaussian/conv2d/flat"


# ---- the safety rule -------------------------------------------------------------------------------

def test_one_rule_turns_a_worst_into_an_allowance():
    assert allowance.allowance("coefficient", 0.0737) == pytest.approx(0.15)  # 2x, up to two digits
    assert allowance.allowance("coefficient", 0.001) == 0.05  # the floor
    assert allowance.allowance("noise", 0.0145) == 3.0 * 0.0145  # 3x, exactly
    assert allowance.allowance("drift", 0.0) == 0.0
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="finite"):
            allowance.allowance("noise", bad)
    with pytest.raises(ValueError, match="kind"):
        allowance.allowance("spectrum", 1.0)
    assert set(allowance.SAFETY) == set(tables.KINDS)


# ---- the one format --------------------------------------------------------------------------------

def committed() -> dict[str, tables.Table]:
    return {p.name: tables.read(p) for p in sorted(tables.DATA_DIR.glob("*.json"))}


def test_every_table_is_in_the_one_format_with_its_provenance():
    found = committed()
    assert set(found) == {"tolerance_cpu.json", "tolerance_cuda.json", "bf16_noise.json", "bf16_drift_noise.json"}
    assert {t.kind for t in found.values()} == set(tables.KINDS)
    for name, table in found.items():
        assert table.provenance["commands"] and table.provenance["date"][:2] == "20", name
        assert table.provenance["torch"] and table.provenance["device"] and table.panel, name
        assert json.loads((tables.DATA_DIR / name).read_text()) == table.to_json(), name  # round trip


def test_writing_and_reading_a_table_changes_nothing(tmp_path):
    for name, table in committed().items():
        tables.write(table, tmp_path / name)
        assert tables.read(tmp_path / name) == table, name


def test_a_malformed_table_is_refused_naming_what_is_missing():
    with pytest.raises(ValueError, match="provenance"):
        tables.from_json({"kind": "noise", "about": "", "entries": {}})
    with pytest.raises(ValueError, match="kind"):
        tables.Table("spectrum", "", {}, {})
    with pytest.raises(ValueError, match="finite"):
        tables.Table("noise", "", {}, {Key.parse("muon/fp32@bf16/ns/gaussian"): tables.Entry(1, {"norm": -1.0})})


def _old(path: str, commit: str = OLD) -> dict:
    """A data file as `commit` held it (default OLD)."""
    done = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"commit {commit} is not in this clone (shallow?): {done.stderr.strip()}")
    return json.loads(done.stdout)


def _converted(name: str, tmp_path) -> tables.Table:
    """A table as the conversion (commit CONVERTED) wrote it: the files have been measured anew since."""
    path = tmp_path / name
    path.write_text(json.dumps(_old(f"harness/policy/data/{name}", CONVERTED)))
    return tables.read(path)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_coefficient_number_survived_the_conversion(device, tmp_path):
    old = _old(f"harness/tolerance_measured/{device}.json")
    new = _converted(f"tolerance_{device}.json", tmp_path)
    assert " ; ".join(new.provenance["commands"]) == old["command"]
    for field in ("date", "torch", "device", "tier", "cases", "runs", "ill_posed_not_counted", "seconds"):
        assert new.provenance[field] == old[field], field
    assert len(new.entries) == len(old["entries"])
    for text, v in old["entries"].items():
        optimizer, rest = text.split(" ", 1)
        e = new.entries[Key.parse(f"{optimizer}/{rest}")]
        assert (e.n, e.worst, e.median, e.worst_case) == (v["n"], {"c": v["worst"]}, {"c": v["median"]},
                                                          {"c": v["worst_case"]}), text


def test_every_noise_number_survived_the_conversion(tmp_path):
    old = _old("harness/bf16_noise.json")
    new = _converted(noise.NOISE_TABLE, tmp_path)
    assert (new.provenance["commands"], new.provenance["date"], new.provenance["torch"]) == (
        old["commands"], old["date"], old["torch"])
    assert new.conditions == {"layers": old["layers"]} and len(new.entries) == len(old["worst"])
    for text, worst in old["worst"].items():
        e = new.entries[Key.parse(text)]
        assert e.worst == worst and e.n == old["cases"][text], text


def test_every_drift_number_survived_the_conversion(tmp_path):
    old = _old("harness/bf16_drift_noise.json")
    new = _converted(noise.DRIFT_TABLE, tmp_path)
    assert (new.provenance["commands"], new.provenance["date"], new.provenance["torch"]) == (
        old["commands"], old["date"], old["torch"])
    assert new.conditions == {"factor": old["factor"]} and list(new.panel) == old["correct"]
    for text, worst in old["worst"].items():
        e = new.entries[Key.parse(text)]
        assert e.worst == worst, text
        assert e.by == {impl: stats[text] for impl, stats in {"ours": old["ours"], **old["others"]}.items()
                        if text in stats}, text
        assert e.n == sum(e.by[impl]["drift"]["n"] for impl in old["correct"] if impl in e.by)


def test_a_drift_worst_is_the_worst_of_its_panel_only():
    """Implementations measured for the record (defects) are in `by`, never in the worst."""
    table = tables.read(tables.DATA_DIR / noise.DRIFT_TABLE)
    recorded = set().union(*(e.by for e in table.entries.values())) - set(table.panel)
    assert recorded, "the drift table records defects beside the panel"
    for key, e in table.entries.items():
        assert e.worst["drift"] == max(s["drift"]["worst"] for m, s in e.by.items() if m in table.panel), key


# ---- lookups ---------------------------------------------------------------------------------------

def test_merge_keeps_each_statistics_worst_and_its_case_and_pools_the_summaries():
    a = tables.Entry(3, {"c": 0.5, "x": 1.0}, {"c": 0.1}, {"c": "a1"},
                     by={"p": {"c": {"worst": 0.5, "n": 3, "mean": 1.0, "sd": 0.0}}})
    b = tables.Entry(10, {"c": 0.2, "x": 2.0}, {"c": 0.05}, {"c": "b1", "x": "b2"},
                     by={"p": {"c": {"worst": 0.2, "n": 1, "mean": 3.0, "sd": 0.0}}, "q": {"c": {"worst": 9, "n": 1}}})
    got = tables.merge([a, b])
    assert got.n == 13 and got.worst == {"c": 0.5, "x": 2.0} and got.worst_case == {"c": "a1", "x": "b2"}
    assert got.median == {"c": 0.05}  # of the entry with the most runs
    pooled = got.by["p"]["c"]
    assert (pooled["worst"], pooled["n"], pooled["mean"]) == (0.5, 4, 1.5)
    assert pooled["sd"] == pytest.approx(math.sqrt((3 * 1 + 9) / 4 - 1.5 ** 2))
    assert got.by["q"] == b.by["q"]


def test_a_lookup_takes_the_included_algorithms_worse_entry_and_says_so():
    table = tolerance.evidence("cpu")
    for key in table.entries:
        if key.optimizer == "dion2":
            inner = table.entries.get(dataclasses.replace(key, optimizer="muon"))
            entry, note = tables.lookup(table, key)
            if inner is not None and inner.worst["c"] > table.entries[key].worst["c"]:
                assert entry.worst["c"] == inner.worst["c"] and "with muon's same key" in note
                assert entry.n == inner.n + table.entries[key].n
                break
    else:
        pytest.fail("no dion2 key whose muon key measured worse")
    assert tables.lookup(table, Key.parse("muon/fp32@fp32/poly-steep/nowhere")) is None


def test_drift_noise_is_read_only_at_the_factor_it_was_measured_with():
    case = Case.from_id("muon/linear-12x20/mb1/noflat/fp32@bf16/ns/spectral_norm/nesterov/wd0/steps8/gaussian/seed0")
    factor = tables.load(noise.DRIFT_TABLE).conditions["factor"]
    assert noise.of_drift(case, "bf16", factor) is not None
    assert noise.of_drift(case, "bf16", 2 * factor) is None
