"""The megabatch relation is bitwise in fp64 exactly where this platform's batched products do not
depend on the stack size (harness/judging/batch_invariance.py), and judged with its tolerance elsewhere: a
Dion2 megabatch whose selected 9 x 20 submatrices hit such products passes, and a megabatch defect
still fails there."""

import pytest
import torch

from cases import Case
from harness.apps.selftest_catalog import BY_NAME, spec
from harness.judging import batch_invariance
from harness.runner import run_case
from harness.running.inputs import make_inputs
from harness.targets import load_target
from optimizers.orthogonalize import orthogonalize

DION2 = Case.from_id("dion2-f0.75/linear-12x20/mb2/noflat/fp64@fp64/ns/spectral_norm/plain/wd0/steps1/gaussian/seed0")
DION2_TALL = Case.from_id("dion2-f0.75/linear_tall-24x6/mb2/noflat/fp64@fp64/ns/spectral_norm/plain/wd0/steps1/"
                          "gaussian/seed0")
MUON = Case.from_id("muon/linear-12x20/mb3/noflat/fp64@fp64/ns/spectral_norm/plain/wd0/steps1/gaussian/seed0")


def megabatch_record(target_spec: str, case: Case):
    torch.set_num_threads(1)
    return next(r for r in run_case(case, load_target(target_spec), target_spec) if r.check == "megabatch")


@pytest.mark.parametrize("case", [DION2, DION2_TALL, MUON], ids=["dion2-9x20", "dion2-24x5", "muon-12x20"])
def test_megabatch_is_bitwise_where_the_products_are_and_passes(case):
    """Property seed 12 drew both Dion2 cases (9 of 12 rows: 9 x 20; 5 of 6 columns: 24 x 5)."""
    torch.set_num_threads(1)
    ours = load_target("ours")
    variant = batch_invariance.megabatch_variant_shapes(case, ours.conventions(case), make_inputs(case))
    record = megabatch_record("ours", case)
    assert record.status == "pass", record.message
    if variant:
        assert "depend on the stack size" in record.message and record.tolerance > 0.0
    else:
        assert record.ratio == 0.0 and record.tolerance == 0.0 and "depend on the stack size" not in record.message


def test_a_megabatch_defect_still_fails_where_the_relation_takes_its_tolerance():
    record = megabatch_record(spec(BY_NAME["stack-norm"]), DION2)
    assert record.status == "fail", record.message


@pytest.mark.parametrize("m, n", [(9, 20), (12, 20), (3, 3), (11, 36), (24, 5), (24, 6), (5, 25)])
def test_an_invariant_verdict_means_ours_orthogonalizes_a_stack_bitwise_as_its_members(m, n):
    torch.set_num_threads(1)
    x = torch.randn(3, m, n, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    together = orthogonalize(x, "newton_schulz", 5, 1e-7, torch.float64)
    alone = torch.cat([orthogonalize(x[i:i + 1], "newton_schulz", 5, 1e-7, torch.float64) for i in range(3)])
    if batch_invariance.batched_products_invariant("cpu", torch.float64, 1, m, n, 3):
        assert torch.equal(together, alone)


def test_the_probe_sees_products_that_depend_on_the_stack_size(monkeypatch):
    """Negative control: products that change with the stack size are reported as not invariant."""
    monkeypatch.setattr(batch_invariance, "_iteration", lambda x: x * x.shape[0])
    batch_invariance._invariant.cache_clear()
    try:
        assert not batch_invariance.batched_products_invariant("cpu", torch.float64, 1, 12, 20, 2)
    finally:
        batch_invariance._invariant.cache_clear()
