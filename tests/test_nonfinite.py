"""The non-finite gradient policy (optimizers/algorithms/base.py): a NaN or inf gradient element reaches the
parameter in the step it arrives, stays in the state, and leaves every other parameter's step as it was;
no algorithm freezes a parameter silently."""

import math

import pytest
import torch

import optimizers
from optimizers.algorithms.dion2 import gather_selected, scatter_selected, top_k_mask
from optimizers.orthogonalize import ORTHOGONALIZERS, polar_via_svd

ALGORITHMS = {"muon": optimizers.Muon, "normuon": optimizers.NorMuon, "dion2": optimizers.Dion2,
              "nordion2": optimizers.NorDion2}
BAD = {"one-nan": lambda g: g.view(-1).__setitem__(5, math.nan),
       "one-inf": lambda g: g.view(-1).__setitem__(5, -math.inf),
       "all-nan": lambda g: g.fill_(math.nan)}
SHAPES = {"wide": ((12, 20), False), "tall": ((24, 6), False), "conv-flat": ((8, 4, 3, 3), True)}


def trajectory(cls, shape, bad_step, spoil, **options):
    """The parameter after each of 3 steps; the gradient of step `bad_step` spoiled by `spoil` (None: none)."""
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(shape, generator=gen))
    opt = cls([p], **options)
    out = []
    for step in range(3):
        g = torch.randn(shape, generator=gen)
        if step == bad_step and spoil is not None:
            spoil(g)
        p.grad = g
        opt.step()
        out.append(p.detach().clone())
    return out


COMBINATIONS = ([(a, "polar_express", b, s) for a in ALGORITHMS for b in BAD for s in SHAPES]
                + [(a, o, "one-nan", "wide") for a in ALGORITHMS for o in ORTHOGONALIZERS if o != "polar_express"])
"""Every algorithm, kind of spoiled gradient and slice orientation; every orthogonalizer once per algorithm."""


@pytest.mark.parametrize("algorithm,orthogonalizer,bad,shape", COMBINATIONS)
def test_a_non_finite_gradient_element_reaches_the_parameter_and_stays(algorithm, orthogonalizer, bad, shape):
    """Before the policy: NorDion2 froze the parameter (finite, never moving) after any NaN or inf element,
    Dion2 after an all-NaN gradient, and Muon's SVD orthogonalizer raised mid-step (LAPACK refuses NaN)."""
    shape, flatten = SHAPES[shape]
    options = dict(orthogonalizer=orthogonalizer, flatten=flatten)
    spoiled = trajectory(ALGORITHMS[algorithm], shape, 1, BAD[bad], **options)
    clean = trajectory(ALGORITHMS[algorithm], shape, 1, None, **options)
    assert torch.isfinite(spoiled[0]).all() and torch.equal(spoiled[0], clean[0])
    assert not torch.isfinite(spoiled[1]).all() and not torch.isfinite(spoiled[2]).all()
    # negative control: the same check flags nothing on the clean run
    assert all(torch.isfinite(p).all() for p in clean)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_non_finite_member_leaves_the_rest_of_its_megabatch_as_it_was(algorithm):
    """Three same-shape parameters stacked in one megabatch: one with a NaN gradient element; the other two
    end bit for bit where they end when every gradient is finite."""
    def run(spoil, nudge=0.0):
        gen = torch.Generator().manual_seed(3)
        ps = [torch.nn.Parameter(torch.randn(12, 20, generator=gen)) for _ in range(3)]
        opt = ALGORITHMS[algorithm](ps)
        for step in range(2):
            for i, p in enumerate(ps):
                p.grad = torch.randn(12, 20, generator=gen) + (nudge if i == 2 else 0.0)
            if step == 0 and spoil:
                ps[0].grad[3, 4] = math.nan
            opt.step()
        return [p.detach() for p in ps]
    spoiled, clean, nudged = run(True), run(False), run(False, nudge=1e-3)
    assert not torch.isfinite(spoiled[0]).all()
    assert torch.equal(spoiled[1], clean[1]) and torch.equal(spoiled[2], clean[2])
    assert not torch.equal(nudged[2], clean[2])  # negative control: a changed member is told apart


@pytest.mark.parametrize("spoiled", [math.nan, math.inf])
def test_dion2_selects_a_slice_whose_norm_is_not_finite_first(spoiled):
    norms = torch.tensor([[3.0, 1.0, 5.0, 0.5, 2.0, 4.0]])
    assert torch.nonzero(top_k_mask(norms, 0.3)[0]).flatten().tolist() == [2, 5]
    norms[0, 3] = spoiled
    assert torch.nonzero(top_k_mask(norms, 0.3)[0]).flatten().tolist() == [2, 3]
    groups = torch.tensor([0, 0, 0, 1, 1, 1])  # local scope: each group its own top slice
    assert torch.nonzero(top_k_mask(norms, 0.3, groups)[0]).flatten().tolist() == [2, 3]


def test_dion2_gathers_and_places_back_a_slice_holding_a_nan():
    """The select stage keeps a selected slice whose L1 norm is NaN (a comparison `> 0` dropped it)."""
    mats = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    mats[:, [1, 3]] = 0.0
    mats[0, 2, 6] = math.nan
    sub, idx = gather_selected(mats, rows=True)
    assert sub.shape == (2, 3, 7) and idx[0].tolist() == [0, 2, 4]
    assert torch.isnan(sub[0, 1, 6]) and torch.isnan(scatter_selected(sub, idx, mats, rows=True)[0, 2, 6])
    assert torch.equal(scatter_selected(sub, idx, mats, rows=True)[1], mats[1])


def test_svd_gives_nan_for_a_non_finite_matrix_and_the_others_their_bits():
    """torch.linalg.svd raises on a NaN (CPU LAPACK) mid-step; the orthogonalizer instead returns NaN for
    that matrix alone."""
    x = torch.randn(3, 6, 9, generator=torch.Generator().manual_seed(5))
    alone = polar_via_svd(x)
    x[1, 2, 3] = math.nan
    with pytest.raises(RuntimeError, match="non-finite"):  # what it protects against
        torch.linalg.svd(x, full_matrices=False)
    out = polar_via_svd(x)
    assert torch.isnan(out[1]).all() and torch.equal(out[0], alone[0]) and torch.equal(out[2], alone[2])


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_adamw_groups_propagate_as_torch_optim_adamw(value):
    """The AdamW fallback and torch.optim.AdamW: the same elements become non-finite, the others agree."""
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(5, 7, generator=gen)
    grads = [torch.randn(5, 7, generator=gen) for _ in range(3)]
    grads[1][2, 3] = value

    def run(make, grads):
        p = torch.nn.Parameter(x.clone())
        opt = make([p])
        for g in grads:
            p.grad = g.clone()
            opt.step()
        return p.detach()
    options = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    ours = run(lambda ps: optimizers.Muon(ps, algorithm="adamw", adamw_eps=1e-8, **options), grads)
    torch_ = run(lambda ps: torch.optim.AdamW(ps, eps=1e-8, **options), grads)
    assert torch.equal(ours.isfinite(), torch_.isfinite()) and not ours[2, 3].isfinite()
    finite = ours.isfinite()
    torch.testing.assert_close(ours[finite], torch_[finite], rtol=1e-5, atol=1e-6)
    clean = run(lambda ps: optimizers.Muon(ps, algorithm="adamw", adamw_eps=1e-8, **options),
                [g.nan_to_num(nan=0.0, posinf=0.0) for g in grads])
    assert clean.isfinite().all()  # negative control: no element is non-finite without one in the gradient
