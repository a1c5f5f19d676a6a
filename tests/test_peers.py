"""The peer adapters: unsupported (never an error) without their package, and, where the peer is
installed, judged on a few cases whose verdicts the findings rest on. The findings' standalone
reproductions under docs/findings/ run here too; each skips when its peer is absent."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from cases import Case
from harness.judging.checks import reference
from harness.runner import run_case
from harness.running.selection import target_tier
from harness.running.inputs import make_inputs
from harness.targets import ALIASES, load_target
from harness.targets.peers import PeerTarget

PEERS = {
    # alias: (import name, pip extra)
    "deepspeed-gram": ("deepspeed", "deepspeed"),
    "deepspeed-standard": ("deepspeed", "deepspeed"),
    "dion": ("dion", "dion"),
    "heavyball": ("heavyball", "heavyball"),
    "dtensor-muon": ("dtensor_muon", "dtensor-muon"),
    "gram-newton-schulz": ("gram_newton_schulz", "gram-newton-schulz"),
}
FINDINGS = Path(__file__).resolve().parent.parent / "docs" / "findings"
CASE = "muon/linear-12x20/mb2/noflat/fp32@bf16/ns/spectral_norm/nesterov/wd0.1/steps2/gaussian/seed0"


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def needs(alias: str):
    name = PEERS[alias][0]
    return pytest.mark.skipif(not installed(name), reason=f"peer {name} is not installed")


def statuses(case_id: str, alias: str) -> dict[str, str]:
    return {r.check: r.status for r in run_case(Case.from_id(case_id), load_target(alias), alias)}


@pytest.mark.parametrize("alias", sorted(PEERS))
def test_alias_loads_a_peer_target(alias):
    assert alias in ALIASES
    target = load_target(alias)
    assert isinstance(target, PeerTarget) and target.name == alias
    assert target.distribution in target.version()


@pytest.mark.parametrize("alias", sorted(PEERS))
def test_absent_peer_makes_every_case_unsupported(alias, monkeypatch):
    """Without its package an adapter still loads; every check of every case is `unsupported` with
    the install command, and nothing raises."""
    name, extra = PEERS[alias]
    real = importlib.import_module

    def no_peer(module, *args, **kwargs):
        if module == name or module.startswith(name + "."):
            raise ImportError(f"No module named {module!r}")
        return real(module, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", no_peer)
    target = load_target(alias)
    records = run_case(Case.from_id(CASE), target, alias)
    assert records and {r.status for r in records} == {"unsupported"}
    assert all(f"pip install 'muon-conformance[{extra}]'" in r.message for r in records)


@needs("heavyball")
def test_heavyball_fp64_is_judged_with_its_fp32_lr_and_state():
    """heavyball keeps lr and momentum in fp32 for fp64 parameters (2e-8 relative): declared, the
    Nesterov case passes at 1e-14. Without Nesterov its bias-corrected EMA's beta_t is formed in fp32
    through expm1/log1p, which the oracle rounds only once: an fp32-sized residue (rel_err 2.7e-8)
    that the floor of its declared scalar format, 8 u(fp32), allows (it failed at 6.6e5 x the fp64
    floor before)."""
    fp64 = "muon/linear-12x20/mb1/noflat/fp64@fp64/ns/spectral_norm/{}/wd0.1/steps3/gaussian/seed0"
    assert set(statuses(fp64.format("nesterov"), "heavyball").values()) == {"pass"}
    case, target = Case.from_id(fp64.format("plain")), load_target("heavyball")
    inputs = make_inputs(case)
    outcome = reference(case, target, inputs, target.run(inputs.params, inputs.grads, case))
    assert outcome.status == "pass" and 1e-9 < outcome.metrics.rel_err < 1e-6
    assert "floor 8 u(fp32) (its declared lr or momentum scalars)" in outcome.tolerance.source


@needs("dion")
def test_dion_megabatch_with_flatten_is_flagged():
    """Finding: dion's Muon(flatten=True) orthogonalizes a megabatch as one matrix."""
    mixed = "muon/conv2d-8x4x3x3/mb3/flat/fp32@bf16/ns/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0"
    got = statuses(mixed, "dion")
    assert got["reference"] == "fail"
    assert set(statuses(mixed.replace("mb3", "mb1"), "dion").values()) == {"pass"}


@needs("dion")
def test_dion_normuon_kernel_rows_are_flagged_only_with_flatten():
    flat = "normuon/conv1d-8x4x5/mb1/flat/bf16@bf16/ns/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0"
    got = statuses(flat, "dion")
    assert got["reference"] == "fail" and got["equiv2d"] == "fail"
    assert set(statuses(flat.replace("/flat/", "/noflat/"), "dion").values()) == {"pass"}


@needs("dion")
@pytest.mark.parametrize("case_id", [
    "muon/linear_row-1x16/mb1/noflat/fp32@bf16/ns/spectral_norm/plain/wd0/steps1/gaussian/seed0",
    "muon/linear_row-1x16/mb5/noflat/fp32@bf16/pe/rms_norm/plain/wd0/steps3/tiny/seed0",
])
def test_dion_rank1_bf16_norm_is_judged_by_its_own_schedules_noise(case_id):
    """`norm` failed these at 1.53 and 1.46 under the noise of our schedules; keyed by what dion declares
    (You's quintics; its Polar Express table with eps 1e-8 on tiny gradients) they pass."""
    got = {r.check: r for r in run_case(Case.from_id(case_id), load_target("dion"), "dion")}
    assert got["norm"].status == "pass", got["norm"].message
    assert ":you/" in got["norm"].tolerance_source or ":pe102/tiny:eps1e-08" in got["norm"].tolerance_source
    assert {r.status for r in got.values()} <= {"pass", "skipped"}


@needs("deepspeed-gram")
def test_deepspeed_conv_kernel_is_an_error_and_a_matrix_passes():
    """Its gram method on the Gram NS cases (this CPU computes it in fp32), its standard one on the NS cases."""
    conv = "muon/conv2d-8x4x3x3/mb1/flat/fp32@fp32/gns/spectral_norm/nesterov/wd0/steps1/huge/seed0"
    assert set(statuses(conv, "deepspeed-gram").values()) == {"error"}
    assert set(statuses(conv.replace("conv2d-8x4x3x3", "linear-12x20").replace("/flat/", "/noflat/"),
                        "deepspeed-gram").values()) == {"pass"}
    assert set(statuses(conv, "deepspeed-standard").values()) == {"unsupported"}
    standard = "muon/conv2d-8x4x3x3/mb1/flat/fp32@bf16/ns/spectral_norm/nesterov/wd0/steps1/lowrank/seed0"
    assert set(statuses(standard, "deepspeed-standard").values()) == {"error"}


@needs("dion")
@needs("deepspeed-gram")
def test_peers_built_from_their_defaults_step_as_those_defaults_say():
    """dion's Muon and NorMuon (weight decay 0.01, Polar Express in bf16) and DeepSpeed's SingleDeviceMuon (the
    gram method, Nesterov) built from the lr alone: their declared defaults hold (robust checks where dion's bf16
    reference is ill-posed); deepspeed-standard is not its default method and declares none."""
    for name, count in (("dion", 4), ("deepspeed-gram", 1), ("deepspeed-standard", 0)):
        rows = [c for c in target_tier("ci", load_target(name)).cases if c.construct == "defaults"]
        assert len(rows) == count, (name, [c.id for c in rows])
        for case in rows:
            got = {r.check: r.status for r in run_case(case, load_target(name), name)}
            assert "pass" in got.values() and set(got.values()) <= {"pass", "skipped"}, (case.id, got)


@needs("gram-newton-schulz")
def test_gram_newton_schulz_restarts_where_our_gram_iteration_does():
    """Its Gram keys were measured with our restarts (before step 2); it auto-tunes its own at construction."""
    import torch

    from optimizers.gram_newton_schulz import RESTARTS
    target, case = load_target("gram-newton-schulz"), Case.from_id(
        "muon/linear-12x20/mb2/noflat/fp32@bf16/gns/spectral_norm/nesterov/wd0.1/steps1/lowrank/seed0")
    optimizer = target.make([torch.nn.Parameter(torch.zeros(12, 20))], case)
    assert optimizer.ns_algorithm == "gram_newton_schulz"
    assert list(optimizer.gram_newton_schulz_reset_iterations) == list(RESTARTS)
    assert set(statuses(case.id, "gram-newton-schulz").values()) <= {"pass", "skipped"}


@needs("heavyball")
def test_probe_is_ill_posed_for_stochastic_rounding():
    """heavyball rounds U to bf16 stochastically: its decayed and undecayed runs round differently, so the
    decay relation (exact only where the same rounding cancels) failed at ratio 1e4-3e5; it is skipped."""
    got = {r.check: r for r in run_case(Case.from_id(
        "muon/linear-12x20/mb1/noflat/fp32@bf16/ns/spectral_norm/plain/wd0/steps1/gaussian/seed0"),
        load_target("heavyball"), "heavyball")}
    assert got["probe"].status == "skipped" and "stochastically" in got["probe"].message
    assert got["reference"].status == "pass"
    # likewise `rescale` (gradients x 2^10 against x 1): it failed 8 such CI cases at 8e3-2e5
    assert got["rescale"].status == "skipped" and "stochastically" in got["rescale"].message


@needs("dtensor-muon")
@pytest.mark.parametrize("case_id", [
    "muon/linear-12x20/mb1/noflat/bf16@bf16/ns/spectral_norm/plain/wd0/steps1/gaussian/seed0",
    "muon/linear_row-1x16/mb1/noflat/bf16@bf16/pe/spectral_norm/plain/wd0.1/steps3/lowrank/seed0",
])
def test_probe_models_cautious_decay(case_id):
    """dtensor-muon decays only where X and O agree in sign: the decay relation models the mask (it
    assumed every entry decayed and failed these at ratio 15-19)."""
    assert statuses(case_id, "dtensor-muon")["probe"] == "pass"


@needs("dtensor-muon")
def test_dtensor_muon_rounds_its_decay_to_bf16_for_fp32_parameters():
    """With fp32 parameters it adds the decay into the bf16 orthogonalized update, so the decay term is
    rounded to bf16: declared (decay_dtype "bf16") every check passes; the same run declared with decay in
    the parameter (the default) fails `probe` (it did at 2415 before the convention)."""
    import dataclasses

    from harness.judging.robust_checks import probe_check

    case = Case.from_id("muon/linear-12x20/mb1/noflat/fp32@bf16/ns/spectral_norm/plain/wd0/steps1/gaussian/seed0")
    target = load_target("dtensor-muon")
    assert target.conventions(case).decay_dtype == "bf16"
    assert set(statuses(case.id, "dtensor-muon").values()) == {"pass"}

    class Undeclared(type(target)):
        def conventions(self, c):
            return dataclasses.replace(super().conventions(c), decay_dtype="fp64")

    undeclared = Undeclared()
    inputs = make_inputs(case)
    got = probe_check(case, undeclared, inputs, undeclared.run(inputs.params, inputs.grads, case))
    assert got.status == "fail" and got.metrics.ratio > 100, got.message


@needs("dtensor-muon")
def test_dtensor_muon_runs_its_pure_torch_loops_on_cpu():
    """bf16 parameters: its decay, added to the bf16 update, is in the parameter's format (fp32 ones: below)."""
    assert set(statuses(CASE.replace("fp32@bf16", "bf16@bf16"), "dtensor-muon").values()) == {"pass"}


@needs("gram-newton-schulz")
def test_gram_newton_schulz_passes_a_batch_of_matrices():
    """Its standard iteration with You's quintics (Polar Express / 1.05 on this Gaussian 8 x 20 direction is
    ill-posed in bf16 under its op-by-op measured key: rtol 0.40, skipped)."""
    case = "muon/conv1d-8x4x5/mb2/noflat/fp32@bf16/ns/rms_norm/nesterov/wd0.1/steps2/gaussian/seed0"
    assert set(statuses(case, "gram-newton-schulz").values()) == {"pass"}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(p.name for p in FINDINGS.glob("*.py")))
def test_finding_reproduces(script):
    """Each finding's standalone reproduction exits 1 while the defect is present upstream."""
    peer = script.split("-")[0]
    if not installed(peer):
        pytest.skip(f"peer {peer} is not installed")
    proc = subprocess.run([sys.executable, str(FINDINGS / script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
