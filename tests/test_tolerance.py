"""The tolerance policy: derived from the orthogonalized direction's spectrum, keyed by what the target
declares (schedule, compute format) and by device class, backed by measured data, and a gap of the
policy is never charged to the target."""

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from cases import Case, axes, ci_cases
from harness.algorithms import registry
from harness.judging.checks import policy
from harness.policy import allowance, keys, sensitivity, tables, tolerance
from harness.policy.calibrate import coefficients as MEASURE
from harness.policy.calibrate import panel
from harness.policy.keys import Key
from harness.runner import run_case
from harness.running.inputs import TORCH_DTYPES, f64, make_inputs
from harness.targets.ours import OursMuon
from oracles import Conventions, Orthogonalizer, newton_schulz_schedule, polar_express_schedule

SEED686 = "muon/linear_tall-24x6/mb5/noflat/fp64@fp64/svd/spectral_norm/nesterov/wd0/steps3/rankdef/seed686"
ROW_BF16 = "muon/linear_row-1x16/mb2/noflat/bf16@bf16/{orth}/spectral_norm/nesterov/wd0/steps3/gaussian/seed0"
GAUSS = "muon/linear-12x20/mb2/noflat/{dtypes}/{orth}/spectral_norm/nesterov/wd0.1/steps3/{grad}/seed0"


class Declares(OursMuon):
    """Our Muon run with another compute dtype and/or orthogonalizer, declared as such."""

    def __init__(self, compute: str | None = None, orthogonalizer: str | None = None):
        self.compute, self.orth = compute, orthogonalizer

    def conventions(self, case):
        conv = OursMuon.conventions(self, case)
        compute = self.compute or conv.compute_dtype
        orth = Orthogonalizer.named(self.orth, compute_dtype=compute) if self.orth else conv.orthogonalizer
        return Conventions(**{**conv.__dict__, "compute_dtype": compute, "orthogonalizer": orth})

    def options(self, case):
        out = OursMuon.options(self, case)
        if self.compute:
            out["compute_dtype"] = TORCH_DTYPES[self.compute]
        if self.orth:
            out["orthogonalizer"] = self.orth
        return out


class Noisy(OursMuon):
    """Negative control: our Muon's updates with a relative error `rel` added (a real, small bug)."""

    def __init__(self, rel: float):
        self.rel = rel

    def run(self, params, grads, case):
        traj = OursMuon.run(self, params, grads, case)
        gen = torch.Generator().manual_seed(0)
        out, prev = [], list(params)
        for step in traj:
            noisy = [p + (x - p) * (1 + self.rel * torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x.dtype))
                     for p, x in zip(prev, step)]
            out.append(noisy)
            prev = step
        return out


def checks_of(case_id, target):
    return {r.check: r for r in run_case(Case.from_id(case_id), target, "test")}


# ---- the evidence ----------------------------------------------------------------------------------------

FLOOR = allowance.SAFETY["coefficient"].floor


def coefficient_tables() -> dict[str, tables.Table]:
    return {d: t for d in tolerance.DEVICE_CLASSES if (t := tolerance.evidence(d)) is not None}


def test_cpu_evidence_exists_and_says_how_it_was_measured():
    found = coefficient_tables()
    assert "cpu" in found
    for device, table in found.items():
        assert table.kind == "coefficient" and table.entries
        assert all("--device" in c for c in table.provenance["commands"])
        assert table.provenance["device"].startswith(device) and table.provenance["torch"]
        assert table.provenance["date"][:2] == "20"


@pytest.mark.parametrize("device", sorted(coefficient_tables()))
def test_every_coefficient_is_2x_to_20x_its_measured_worst(device):
    for key, m in tolerance.evidence(device).entries.items():
        worst = m.worst[tolerance.STATISTIC]
        c = tolerance.coefficient(worst)
        if 2.0 * worst <= FLOOR:
            assert c == FLOOR, key  # too little measured error to go below the floor
        else:
            assert 2.0 * worst <= c <= 20.0 * worst, (key, worst, c)
        assert m.n >= 1 and m.worst_case[tolerance.STATISTIC] and 0.0 <= m.median[tolerance.STATISTIC] <= worst, key


def test_coefficient_is_twice_the_worst_rounded_up_to_two_digits():
    assert tolerance.coefficient(0.1) == pytest.approx(0.2)
    assert tolerance.coefficient(0.0737) == pytest.approx(0.15)
    assert tolerance.coefficient(0.333) == pytest.approx(0.67)
    assert tolerance.coefficient(5.56) == pytest.approx(12.0)
    assert tolerance.coefficient(0.0) == FLOOR
    # monotone: a small measured worst never gives a tighter c than no measured error at all
    assert tolerance.coefficient(0.0085) == FLOOR
    assert tolerance.coefficient(0.026) == pytest.approx(0.052)


CROSS_MACHINE = 0.15
"""Relative spread allowed between a rerun worst c and the recorded one across x86 CPUs: the largest measured
was 9.2% (below); a recorded worst that no run produced would be off by far more."""


@pytest.mark.parametrize("key", ["muon/fp32@fp32/poly-steep/well", "muon/fp64@fp64/svd/well",
                                 "normuon/bf16@bf16/poly-mild/well"])
def test_the_measurement_reproduces_within_its_recorded_worst(key):
    """The data is a measurement, not a wish: rerunning the case recorded as a key's worst needs the
    recorded c, within CROSS_MACHINE. Exact on the machine that measured it, but not across CPUs: on
    2026-12-01 a CI-class machine (an AVX-512 Xeon, the same torch 2.13.0 CPU build and seeds) gave 0.908x
    and 0.920x the recorded c of the first two keys below, run after run, with numpy 2.3.5-2.4.6 and scipy
    1.16.3-1.17.1 alike, and the same under ATEN_CPU_CAPABILITY=avx2/default and every MKL_CBWR
    setting; the third reproduced exactly."""
    torch.set_num_threads(1)  # as measured
    recorded = tolerance.evidence("cpu").entries[Key.parse(key)]
    run, scaled, factor = recorded.worst_case[tolerance.STATISTIC].partition(" scaled x ")
    case_id, _, member = run.partition(" by ")  # the panel member that needed it, if not ours
    target = panel.build(member) if member else OursMuon()
    runs = {label: (k, c) for k, c, label in MEASURE.measure(Case.from_id(case_id), target, torch.device("cpu"))}
    got_key, c = runs[scaled + factor]
    assert str(got_key) == key and c == pytest.approx(recorded.worst[tolerance.STATISTIC], rel=CROSS_MACHINE, abs=0)
    assert str(MEASURE.policy_key(Case.from_id(case_id), target)) == key  # what --per-key counts, without a run


def test_policy_covers_our_muon_on_every_ci_case():
    """Every CI case our Muon runs has an entry, but a case no tolerance could judge (a selection tie, or
    tolerance.unmeasurable_why), whose reference check is skipped as ill-posed, never unsupported. A case of
    non-finite gradients is judged by its policy check alone."""
    for case in ci_cases()[::3]:
        if case.grad == axes.NONFINITE_GRADIENT:
            continue
        inputs = make_inputs(case)
        try:
            pol = policy(case, OursMuon(), inputs)
        except tolerance.NoEntry:
            got = checks_of(case.id, OursMuon())["reference"]
            assert got.status == "skipped" and "ill-posed" in got.message, (case.id, got.status, got.message)
            continue
        assert 0.0 < pol.at(0, 0).rtol and pol.at(0, 0).source, case.id


# ---- derived from the spectrum (issue "Trust on first contact" section 1) ---------------------------------

def test_seed686_passes_with_a_rtol_derived_from_the_direction_spectrum():
    """Member 4's step-2 direction (mu M + G over two rank-3 gradients) is full rank with s_min/s_max =
    1.56e-4: its polar factor amplifies rounding ~6.4e3x. Both LAPACK and torch are right; the rtol
    follows the direction's spectrum, not the gradient's (rank-deficient) one."""
    case = Case.from_id(SEED686)
    pol = policy(case, OursMuon(), make_inputs(case))
    amp = pol.sensitivities[4][1].amplification
    assert amp == pytest.approx(1 / 1.5595e-4, rel=1e-3)
    others = [s.amplification for i, row in enumerate(pol.sensitivities) for k, s in enumerate(row) if (i, k) != (4, 1)]
    assert max(others) < amp / 20
    assert pol.at(4, 1).rtol > 20 * pol.at(0, 0).rtol and "amplification 6.41e+03" in pol.at(4, 1).source
    got = checks_of(SEED686, OursMuon())
    assert all(r.status == "pass" for r in got.values()), [(r.check, r.status, r.ratio) for r in got.values()]


@pytest.mark.parametrize("rel", [1e-10, 1e-6])
def test_derived_tolerance_still_flags_a_small_bug(rel):
    assert checks_of(SEED686, Noisy(rel))["reference"].status == "fail"


def test_noise_that_the_fp32_policy_allows_fails_fp64():
    case_id = GAUSS.format(dtypes="fp64@fp64", orth="pe", grad="gaussian")
    assert checks_of(case_id, Noisy(1e-9))["reference"].status == "fail"
    assert checks_of(case_id, OursMuon())["reference"].status == "pass"


def test_polynomial_amplification_follows_the_slope():
    ns = newton_schulz_schedule(5)
    e_small, _ = sensitivity.polynomial_errors(ns, np.array([1.0, 1e-3]))
    e_top, _ = sensitivity.polynomial_errors(ns, np.array([1.0, 0.5]))
    assert e_small[1] > 5 * e_top[1]  # f'(0) = 3.4445^5 = 490: small singular values amplify most (2.1e3 vs 2.2e2)
    steep, _ = sensitivity.polynomial_errors(polar_express_schedule(5), np.array([1 / 1.01]))
    assert steep[0] > 1.0


def test_svd_rank_cutoff_among_singular_values_is_ill_posed():
    spec = Orthogonalizer.named("svd", compute_dtype="fp64")
    cutoff = spec.rcond_factor * 6
    u = np.diag([1.0, 0.5, 1.5 * cutoff, 0.0, 0.0, 0.0])
    assert "cut-off" in sensitivity.of_direction(u, spec, False).ambiguous_rank
    assert sensitivity.of_direction(np.diag([1.0, 0.5, 0.0]), spec, False).ambiguous_rank == ""


# ---- keyed by what the target declares (issue "Judge the optimizers people actually run") ---------------

def test_schedule_class_comes_from_the_declared_coefficients():
    steep = Orthogonalizer("polynomial", ((3.0, -16.0, 12.0),) + tuple(newton_schulz_schedule(4)))
    assert keys.schedule_class(steep) == "poly-steep"
    assert keys.schedule_class(Orthogonalizer.named("newton_schulz")) == "poly-mild"
    assert keys.schedule_class(Orthogonalizer.named("polar_express")) == "poly-steep"
    assert keys.schedule_class(Orthogonalizer.named("svd")) == "svd"


@pytest.mark.parametrize("dtypes", ["fp32@fp32", "bf16@bf16"])
def test_a_peer_running_another_schedule_is_judged_by_its_declared_schedule(dtypes):
    """A peer that runs Polar Express on a rank-1 case named "ns": keyed by its declaration (steep first
    polynomial), never by the case's name; in fp32 it is judged and passes, in bf16 it is never a failure
    (rounding alone moves a rank-1 Polar Express update by ~25% there: ill-posed, or not yet measured)."""
    case = Case.from_id(ROW_BF16.format(orth="ns").replace("bf16@bf16", dtypes))
    peer = Declares(orthogonalizer="polar_express")
    assert keys.schedule_class(peer.conventions(case).orthogonalizer) == "poly-steep"
    got = checks_of(case.id, peer)["reference"]
    if dtypes == "fp32@fp32":
        assert got.status == "pass" and "poly-steep/rank-1" in got.tolerance_source, got.message
    else:
        assert got.status in ("skipped", "unsupported") and ("ill-posed" in got.message or "no entry" in got.message)


def test_ill_posedness_follows_the_declared_compute_dtype():
    """fp32@fp32 rank-deficient: judged for an fp32 target, ill-posed (skipped, not failed) for a target
    that declares bf16 compute."""
    case_id = GAUSS.format(dtypes="fp32@fp32", orth="ns", grad="rankdef")
    assert checks_of(case_id, OursMuon())["reference"].status == "pass"
    bf16 = checks_of(case_id, Declares(compute="bf16"))["reference"]
    assert bf16.status == "skipped" and "ill-posed" in bf16.message and "bf16" in bf16.message


@pytest.mark.parametrize("compute", ["bf16", "fp16"])
def test_fp64_parameters_with_half_precision_compute_are_judged(compute):
    case_id = GAUSS.format(dtypes="fp64@fp32", orth="ns", grad="gaussian")
    got = checks_of(case_id, Declares(compute=compute))["reference"]
    assert got.status == "pass" and f"fp64@{compute}" in got.tolerance_source


def test_a_missing_entry_is_unsupported_never_error():
    """SVD declared in fp16 was never measured: a gap of the policy, reported as unsupported."""
    case_id = GAUSS.format(dtypes="fp32@fp32", orth="svd", grad="gaussian")
    got = checks_of(case_id, Declares(compute="fp16"))
    assert got["reference"].status == "unsupported"
    assert "the tolerance policy has no entry for muon/fp32@fp16/svd" in got["reference"].message
    assert all(r.status != "error" for r in got.values())


def _committed(device: str) -> Path:
    """The committed coefficient table file of `device`, whatever DATA_DIR points at."""
    return Path(tolerance.__file__).with_name("data") / tolerance.table_name(device)


@pytest.fixture
def data_dir(monkeypatch, tmp_path):
    """An empty table directory in place of harness/policy/data, the loader's cache cleared around the test."""
    monkeypatch.setattr(tables, "DATA_DIR", tmp_path)
    tables.load.cache_clear()
    yield tmp_path
    tables.load.cache_clear()


def test_cuda_without_its_measurement_falls_back_to_cpu_loudly(data_dir):
    tables.write(tables.read(_committed("cpu")), data_dir / tolerance.table_name("cpu"))
    case = Case.from_id(GAUSS.format(dtypes="fp32@fp32", orth="svd", grad="gaussian"))
    grads = [[f64(g) for g in step] for step in make_inputs(case).grads]
    on_cuda = tolerance.for_case(case, OursMuon().conventions(case), grads, "cuda")
    on_cpu = tolerance.for_case(case, OursMuon().conventions(case), grads, "cpu")
    assert "cpu measurement used on cuda" in on_cuda.at(0, 0).source
    assert "measured on cpu" in on_cpu.at(0, 0).source and on_cpu.at(0, 0).rtol == on_cuda.at(0, 0).rtol
    with pytest.raises(ValueError, match="device class"):
        tolerance.for_case(case, OursMuon().conventions(case), grads, "tpu")


def test_a_device_measurement_is_used_for_its_device(data_dir):
    cpu = tables.read(_committed("cpu"))
    cuda = dataclasses.replace(cpu, provenance={**cpu.provenance, "device": "cuda: test"},
                               entries={k: dataclasses.replace(v, worst={"c": 10 * v.worst["c"]})
                                        for k, v in cpu.entries.items()})
    tables.write(cpu, data_dir / tolerance.table_name("cpu"))
    tables.write(cuda, data_dir / tolerance.table_name("cuda"))
    case = Case.from_id(GAUSS.format(dtypes="fp32@fp32", orth="svd", grad="gaussian"))
    grads = [[f64(g) for g in step] for step in make_inputs(case).grads]
    on_cuda = tolerance.for_case(case, OursMuon().conventions(case), grads, "cuda")
    on_cpu = tolerance.for_case(case, OursMuon().conventions(case), grads, "cpu")
    assert "measured on cuda" in on_cuda.at(0, 0).source and on_cuda.at(0, 0).rtol > on_cpu.at(0, 0).rtol


def test_tolerance_source_is_one_line_naming_entry_class_and_numbers():
    case = Case.from_id(SEED686)
    source = policy(case, OursMuon(), make_inputs(case)).at(4, 1).source
    assert "\n" not in source
    for part in ("muon/fp64@fp64/svd/ill", "amplification", "condition", "measured on cpu", "u(fp64)"):
        assert part in source, part
    assert math.isfinite(float(source.split("rtol ")[1].split()[0]))


# ---- Hypothesis's case space (issue 8: the property tests' findings) --------------------------------------

DION2_ONE_ROW = "dion2-f0.05/linear-12x20/mb1/noflat/fp32@fp32/pe/spectral_norm/plain/wd0/steps2/gaussian/seed0"


def test_dion2_is_judged_by_the_spectrum_of_what_it_orthogonalizes():
    """Dion2 with fraction 0.05 of 12 rows orthogonalizes one 1 x 20 row per step (one singular value,
    where Polar Express amplifies 75.5x), not Muon's 12 x 20 momentum (295-344x here): its amplification
    and its conditioning class ("rank-1") are that row's."""
    case = Case.from_id(DION2_ONE_ROW)
    conv = OursMuon().conventions(case)
    grads = [[f64(g) for g in step] for step in make_inputs(case).grads]
    sens = sensitivity.of_case(case, conv, grads)
    assert all(s.shape == (1, 20) for row in sens for s in row)
    assert tolerance.conditioning_class(case, sens) == "rank-1"
    row = sensitivity.of_matrices(np.ones((1, 1, 20)), conv.orthogonalizer).amplification
    assert all(s.amplification == pytest.approx(row, rel=1e-3) for r in sens for s in r)
    muon = sensitivity.of_case(dataclasses.replace(case, optimizer="muon", fraction=None), conv, grads)
    assert all(s.shape == (12, 20) and s.amplification > 3 * row for r in muon for s in r)


DION2_AS_MUON = "dion2-f1/conv2d-8x4x3x3/mb1/noflat/fp64@fp64/ns/spectral_norm/plain/wd0/steps1/tiny/seed3065"


def test_a_dion2_key_allows_what_muon_does_on_the_steps_dion2_shares(monkeypatch):
    """Dion2 with fraction 1 steps exactly as Muon (the same bits here): property seed 18 drew this case,
    whose error Muon's key allows (0.51x) and Dion2's own, measured on fewer such cases, did not
    (1.02x). A Dion2 key's coefficient is at least its Muon key's; without that (the negative
    control) the same step fails."""
    case, ours = Case.from_id(DION2_AS_MUON), OursMuon()
    muon_case = dataclasses.replace(case, optimizer="muon", fraction=None)
    inputs = make_inputs(case)
    dion2, muon = policy(case, ours, inputs), policy(muon_case, ours, inputs)
    assert dion2.coefficient == muon.coefficient and "with muon's same key" in dion2.at(0, 0).source
    assert {r.check: r.status for r in run_case(case, ours, "ours")}["reference"] == "pass"
    monkeypatch.setitem(registry(), "dion2", dataclasses.replace(registry()["dion2"], includes=None))
    assert policy(case, ours, inputs).coefficient < muon.coefficient
    assert {r.check: r.status for r in run_case(case, ours, "ours")}["reference"] == "fail"


EMPTY = tables.Table("coefficient", "no measurement", {"commands": []}, {})


def test_a_policy_gap_is_unsupported_in_every_check_that_needs_the_policy(monkeypatch):
    """scale and fraction1 passed the gap on as a failure (ratio nan) or lost it: unsupported, as in reference."""
    monkeypatch.setattr(tolerance, "evidence", lambda device: EMPTY)
    got = checks_of("dion2-f1/conv2d-8x4x3x3/mb2/flat/fp32@fp32/pe/spectral_norm/plain/wd0/steps2/gaussian/seed0",
                    OursMuon())
    for name in ("reference", "megabatch", "equiv2d", "fraction1", "scale"):
        assert got[name].status == "unsupported" and "no entry" in got[name].message, (name, got[name].status)


FLOOR_CASE = "muon/linear-12x20/mb1/noflat/bf16@fp32/ns/spectral_norm/nesterov/wd0/steps1/rankdef/seed0"


def test_a_key_with_little_measured_error_keeps_the_floor():
    """Found by Hypothesis (seeds 4 and 6): a correct step needing c 0.032 in a key whose measured
    worst was 0.0085 failed at 1.6x under c 0.017, below the floor a key with no measured error gets.
    At the floor its rtol (amplification ~1700 in bf16) exceeds ILL_POSED_RTOL: rounding alone moves
    this update by a quarter, so it is skipped as ill-posed, never failed (nor passed)."""
    case = Case.from_id(FLOOR_CASE)
    pol = policy(case, OursMuon(), make_inputs(case))
    assert str(pol.key) == "muon/bf16@fp32/poly-mild/ill" and pol.coefficient >= FLOOR
    assert tolerance.coefficient(0.0085) == FLOOR  # the worst it had then: now the floor
    got = checks_of(FLOOR_CASE, OursMuon())["reference"]
    assert got.status == "skipped" and got.message.startswith("ill-posed"), (got.status, got.message)


def test_the_floor_follows_the_scalar_formats_a_target_declares():
    """A target holding lr or its momentum coefficients in fp32 while it computes fp64 forms them in
    fp32, maybe by another formula than the oracle's one rounding (heavyball's bias correction through
    expm1/log1p): a few fp32 units of the update, real and harmless. The floor is 8 u of the coarsest
    declared scalar format; our own fp64 arithmetic keeps the fp64 floor, and fp32 compute keeps its own."""
    case = Case.from_id("muon/linear-12x20/mb1/noflat/fp64@fp64/ns/spectral_norm/plain/wd0/steps1/gaussian/seed0")
    grads = [[f64(g) for g in step] for step in make_inputs(case).grads]
    ours = OursMuon().conventions(case)
    fp32_scalars = dataclasses.replace(ours, lr_dtype="fp32", state_dtype="fp32")
    plain = tolerance.for_case(case, ours, grads, "cpu")
    held = tolerance.for_case(case, fp32_scalars, grads, "cpu")
    assert plain.floor() == 8 * tolerance.unit_roundoff("fp64")
    assert held.floor() == 8 * tolerance.unit_roundoff("fp32")
    assert "floor 8 u(fp32) (its declared lr or momentum scalars)" in held.at(0, 0).source
    fp32_case = Case.from_id(case.id.replace("fp64@fp64", "fp32@fp32"))
    fp32_grads = [[f64(g) for g in step] for step in make_inputs(fp32_case).grads]
    fp32 = OursMuon().conventions(fp32_case)
    assert (tolerance.for_case(fp32_case, dataclasses.replace(fp32, lr_dtype="fp32"), fp32_grads, "cpu").floor()
            == tolerance.for_case(fp32_case, fp32, fp32_grads, "cpu").floor())


def test_a_policy_gap_on_a_tie_selection_is_skipped_as_ill_posed(monkeypatch):
    """On an H200, 26 nightly Dion2/NorDion2 bf16-parameter cases were `unsupported` (10 keys without a cuda entry):
    the measurement leaves out runs whose selection is within rounding of a tie, and every measured run
    of those keys was one. A policy gap is now `skipped` as ill-posed where the run is such a tie, as a
    case with an entry is; a case without a tie still reports the gap as unsupported."""
    tie = "nordion2-f0.25/conv1d-8x4x5/mb1/noflat/bf16@fp32/ns/spectral_norm/plain/wd0/steps3/gaussian/seed0"
    with_entries = checks_of(tie, OursMuon())
    monkeypatch.setattr(tolerance, "evidence", lambda device: EMPTY)
    without = checks_of(tie, OursMuon())
    for name in ("reference", "scale"):
        for got in (with_entries, without):
            assert got[name].status == "skipped" and "ill-posed selection" in got[name].message, (name, got[name].message)
    well_posed = checks_of("dion2-f1/conv2d-8x4x3x3/mb2/flat/fp32@fp32/pe/spectral_norm/plain/wd0/steps2/gaussian/seed0",
                           OursMuon())
    assert well_posed["reference"].status == "unsupported" and "no entry" in well_posed["reference"].message
