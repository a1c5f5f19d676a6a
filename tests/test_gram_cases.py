"""Gram Newton-Schulz in the harness: its cases in the tiers, its oracle (the spectral map of the same
schedule), its own tolerance key, and a broken Gram iteration that the harness flags."""

import pytest
import torch

from cases import Case, axes, matrix_shape, tier
from harness.policy import keys
from harness.runner import run_case
from harness.targets.ours import OursMuon
from optimizers import gram_newton_schulz as gram
from oracles import Orthogonalizer

FP64_CASE = "muon/linear-12x20/mb1/noflat/fp64@fp64/gns/spectral_norm/plain/wd0/steps1/rankdef/seed0"


def gram_cases(name):
    return [c for c in tier(name) if c.orthogonalizer == axes.GRAM]


def aspect(case):
    m, n = matrix_shape(case.shape, case.flatten)[-2:]
    return max(m, n) / min(m, n)


def test_ci_carries_a_few_gram_cases_nightly_more():
    ci, nightly = gram_cases("ci"), gram_cases("nightly")
    assert 8 <= len(ci) <= 48 and set(ci) < set(nightly) and len(nightly) >= 3 * len(ci)
    assert {(c.param_dtype, c.compute_dtype) for c in ci} == {("fp64", "fp64"), ("fp32", "fp32"), ("fp32", "bf16"),
                                                               ("bf16", "bf16")}
    assert {(c.param_dtype, c.compute_dtype) for c in nightly} == set(axes.DTYPE_PAIRS)
    for cases in (ci, nightly):
        assert {"rankdef", "lowrank"} <= {c.grad for c in cases}
        assert min(map(aspect, cases)) == 1 and max(map(aspect, cases)) >= 16  # square to 1:16


@pytest.mark.parametrize("name", ["ci", "nightly"])
def test_every_layer_has_gram_cases_the_gram_peers_can_run(name):
    """DeepSpeed's gram method (Nesterov, lr mode spectral_norm, 4-D layers flattened and no others; fp32 on
    CPU) and gram-newton-schulz (bf16 compute): every layer of the tier, in each dtype pair they compute in."""
    layers = axes.LAYERS if name == "ci" else axes.all_layers()
    runnable = {(c.layer, c.param_dtype, c.compute_dtype) for c in gram_cases(name)
                if c.nesterov and c.adjust_lr == "spectral_norm" and c.flatten == (len(c.shape) == 4)}
    for pair in (("fp32", "fp32"), ("fp32", "bf16"), ("bf16", "bf16")):
        assert {layer for layer, *dtypes in runnable if tuple(dtypes) == pair} == set(layers), pair


def test_gram_case_ids_parse_back():
    case = Case.from_id(FP64_CASE)
    assert case.orthogonalizer == "gram_newton_schulz" and case.id == FP64_CASE


def test_the_oracle_is_the_spectral_map_of_the_same_schedule_keyed_apart():
    gns, pe = Orthogonalizer.named("gram_newton_schulz"), Orthogonalizer.named("polar_express")
    assert (gns.kind, gns.schedule, gns.normaliser) == (pe.kind, pe.schedule, pe.normaliser)
    assert (gns.iteration, pe.iteration) == ("gram", "standard")
    assert keys.schedule_class(gns) == "gram-poly-steep" and keys.schedule_class(pe) == "poly-steep"


def test_fp64_gram_case_agrees_with_the_oracle_near_1e12():
    got = {r.check: r for r in run_case(Case.from_id(FP64_CASE), OursMuon(), "test")}
    ref = got["reference"]
    assert ref.status == "pass" and ref.rel_err < 1e-11, (ref.status, ref.rel_err, ref.message)


def test_a_gram_iteration_with_a_stale_restart_is_flagged(monkeypatch):
    """Negative control: a restart that re-forms X but keeps the old R (a plausible slip) is caught in fp64."""
    def stale_restart(x, coefficients, restarts, kernels=None):
        eye = torch.eye(x.size(-2), dtype=x.dtype, device=x.device)
        r, q = x @ x.mT, None
        for i, (a, b, c) in enumerate(coefficients):
            if i in restarts and q is not None:
                x, q = q @ x, None  # R not re-formed from the new X
            z = torch.baddbmm(r, r, r, beta=b, alpha=c)
            q = z + a * eye if q is None else torch.baddbmm(q, q, z, beta=a)
            if i < len(coefficients) - 1 and i + 1 not in restarts:
                rz = torch.baddbmm(r, z, r, beta=a)
                r = torch.baddbmm(rz, z, rz, beta=a)
        return x if q is None else q @ x

    monkeypatch.setattr(gram, "gram_steps", stale_restart)
    got = {r.check: r for r in run_case(Case.from_id(FP64_CASE), OursMuon(), "test")}
    assert got["reference"].status == "fail", got["reference"].message
