"""optimizers.Dion2 / NorDion2 (single process) against the FP64 oracle and their exact relations."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

import optimizers
from cases import Case
from cases.strategies import cases
from harness.runner import run_case
from harness.targets import load_target
from oracles import (Conventions, Dion2Hyper, NorDion2Hyper, Orthogonalizer, initial_row_variance,
                     reference_dion2_step, reference_nordion2_step)

OURS = load_target("ours")
SVD64 = Conventions(Orthogonalizer.named("svd", compute_dtype="fp64"), compute_dtype="fp64")


def run(cls, x, grads, **options):
    p = torch.nn.Parameter(x.clone())
    opt = cls([p], **options)
    out = []
    for g in grads:
        p.grad = g.clone()
        opt.step()
        out.append(p.detach().clone())
    return out, opt


def grads_like(shape, steps=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(steps)]


@pytest.mark.parametrize("shape,flatten", [((12, 20), False), ((24, 6), False), ((8, 4, 3, 3), True),
                                           ((40, 2, 2, 2), True), ((3, 4, 6), False)])
@pytest.mark.parametrize("nor", [False, True])
def test_steps_equal_the_fp64_oracle(shape, flatten, nor):
    x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    grads = grads_like(shape)
    cls = optimizers.NorDion2 if nor else optimizers.Dion2
    got, _ = run(cls, x, grads, lr=0.02, fraction=0.25, weight_decay=0.1, flatten=flatten, orthogonalizer="svd",
                 compute_dtype=torch.float64)
    args = (0.02, 0.25, 0.95, 0.1, flatten)
    conv = SVD64 if flatten else dataclasses.replace(SVD64, lr_dims="last_two")  # Muon's fans without flatten
    xr, m = x.numpy(), np.zeros(shape)
    v = initial_row_variance(shape, flatten)
    for g, p in zip(grads, got):
        if nor:
            xr, m, v, margin = reference_nordion2_step(xr, m, v, g.numpy(), NorDion2Hyper(*args), conv)
        else:
            xr, m, margin = reference_dion2_step(xr, m, g.numpy(), Dion2Hyper(*args), conv)
        assert margin > 1e-6 and np.abs(p.numpy() - xr).max() < 1e-14


@pytest.mark.parametrize("shape", [(8, 4, 5), (8, 4, 3, 3), (6, 3, 2, 3, 3), (40, 2, 2, 2)])
@pytest.mark.parametrize("cls", [optimizers.Dion2, optimizers.NorDion2])
def test_flattened_conv_is_bitwise_its_2d_matrix(shape, cls):
    flat = (shape[0], math.prod(shape[1:]))
    x = torch.randn(shape, dtype=torch.float64)
    grads = grads_like(shape)
    conv, _ = run(cls, x, grads, flatten=True, fraction=0.25, weight_decay=0.1, compute_dtype=torch.float64)
    mat, _ = run(cls, x.reshape(flat), [g.reshape(flat) for g in grads], fraction=0.25, weight_decay=0.1,
                 compute_dtype=torch.float64)
    assert all(torch.equal(a.reshape(flat), b) for a, b in zip(conv, mat))


@pytest.mark.parametrize("shape", [(12, 20), (24, 6), (8, 4, 3, 3)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_fraction_one_is_bitwise_muon_with_momentum_ef_decay(shape, dtype):
    x = torch.randn(shape).to(dtype)
    grads = [g.to(dtype) for g in grads_like(shape, steps=4)]
    dion, _ = run(optimizers.Dion2, x, grads, lr=0.02, fraction=1.0, ef_decay=0.9, weight_decay=0.1, flatten=True)
    muon, _ = run(optimizers.Muon, x, grads, lr=0.02, momentum=0.9, nesterov=False, weight_decay=0.1, flatten=True)
    assert all(torch.equal(a, b) for a, b in zip(dion, muon))
    nordion, _ = run(optimizers.NorDion2, x, grads, lr=0.02, fraction=1.0, ef_decay=0.9, flatten=True)
    normuon, _ = run(optimizers.NorMuon, x, grads, lr=0.02, momentum=0.9, flatten=True)
    assert all(torch.equal(a, b) for a, b in zip(nordion, normuon))


def test_megabatch_member_is_bitwise_the_member_alone():
    shape = (8, 4, 3, 3)
    xs = [torch.randn(shape, dtype=torch.float64) for _ in range(3)]
    grads = [grads_like(shape, seed=s) for s in range(3)]
    params = [torch.nn.Parameter(x.clone()) for x in xs]
    opt = optimizers.Dion2(params, flatten=True, fraction=0.5, compute_dtype=torch.float64)
    for k in range(3):
        for p, g in zip(params, grads):
            p.grad = g[k].clone()
        opt.step()
    for i in range(3):
        alone, _ = run(optimizers.Dion2, xs[i], grads[i], flatten=True, fraction=0.5, compute_dtype=torch.float64)
        assert torch.equal(alone[-1], params[i].detach())


def test_group_algorithm_names_select_the_records():
    p, q = torch.nn.Parameter(torch.randn(6, 8)), torch.nn.Parameter(torch.randn(6, 8))
    opt = optimizers.Muon([{"params": [p], "algorithm": "dion2", "fraction": 0.5},
                           {"params": [q], "algorithm": optimizers.NORDION2}])
    p.grad, q.grad = torch.randn(6, 8), torch.randn(6, 8)
    opt.step()
    assert set(opt.state[p]) == {"momentum"} and set(opt.state[q]) == {"momentum", "variance"}
    assert int((opt.state[q]["variance"] != 0).sum()) == 2  # ceil(0.25 * 6) rows selected


@pytest.mark.parametrize("options,error,match", [
    (dict(fraction=0.0), ValueError, "fraction"),
    (dict(fraction=1.5), ValueError, "fraction"),
    (dict(fraction=-0.5), ValueError, "fraction"),
    (dict(fraction="half"), TypeError, "fraction"),
    (dict(ef_decay=-0.1), ValueError, "ef_decay"),
    (dict(ef_decay=1.5), ValueError, "ef_decay"),
    (dict(selection_scope="everywhere"), ValueError, "selection_scope"),
    (dict(nesterov=True), ValueError, "Nesterov"),
    (dict(orthogonalizer="qr"), ValueError, "orthogonalizer"),
    (dict(beta2=1.0, algorithm="nordion2"), ValueError, "beta2"),
])
def test_bad_options_are_rejected_at_construction(options, error, match):
    with pytest.raises(error, match=match):
        optimizers.Dion2([torch.nn.Parameter(torch.randn(4, 6))], **options)


def test_a_failing_load_changes_nothing():
    p = torch.nn.Parameter(torch.randn(8, 4, 3, 3))
    opt = optimizers.NorDion2([p], flatten=True)
    p.grad = torch.randn(8, 4, 3, 3)
    opt.step()
    saved = opt.state_dict()
    before = {k: v.clone() for k, v in opt.state[p].items()}
    bad = {**saved, "state": {0: {**saved["state"][0], "variance": torch.zeros(8, 4, 3, 1)}}}
    with pytest.raises(ValueError, match="variance"):
        opt.load_state_dict(bad)
    assert all(torch.equal(opt.state[p][k], v) for k, v in before.items())
    assert opt.state[p]["momentum"].shape == (8, 4, 3, 3) and opt.state[p]["variance"].shape == (8, 1, 1, 1)
    opt.load_state_dict(saved)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(optimizers=("dion2", "nordion2")))
def test_our_dion2_conforms_on_any_case(case):
    """Any layer, dtype pair, orthogonalizer, fraction in (0, 1], gradient kind: every check passes
    or is skipped with its reason (an ill-posed selection or gradient); a policy gap fails here too
    (the measurement covers this strategy's space)."""
    torch.set_num_threads(1)
    bad = [r for r in run_case(case, OURS, "ours") if r.status not in ("pass", "skipped")]
    assert not bad, [(r.check, r.status, r.ratio, r.message) for r in bad]


def test_a_dion2_state_does_not_load_into_muon():
    p = torch.nn.Parameter(torch.randn(6, 8))
    dion = optimizers.Dion2([p])
    p.grad = torch.randn(6, 8)
    dion.step()
    muon = optimizers.Muon([p])
    with pytest.raises(ValueError):
        muon.load_state_dict(dion.state_dict())
    assert muon.state_dict()["state"] == {}


def test_tied_selection_is_skipped_never_passed():
    """Zero gradients tie every slice norm: the reference comparison is skipped with its reason,
    while finiteness is still judged."""
    case = Case.from_id("dion2-f0.25/conv2d-8x4x3x3/mb2/flat/fp32@fp32/pe/spectral_norm/plain/wd0/steps2/zero/seed0")
    records = {r.check: r for r in run_case(case, OURS, "ours")}
    assert records["reference"].status == "skipped" and "ill-posed selection" in records["reference"].message
    assert records["finite"].status == "pass"


def test_a_mesh_of_two_dims_is_refused_naming_it():
    """one_dim_mesh refuses a 2-D mesh (its `ndim < 1` mutant let one through; no gloo case holds a 2-D mesh)."""
    import types
    from optimizers.algorithms.dion2 import one_dim_mesh
    flat = types.SimpleNamespace(device_mesh=types.SimpleNamespace(ndim=1, shape=(4,)))
    one_dim_mesh("param group 0", 0, flat)
    square = types.SimpleNamespace(device_mesh=types.SimpleNamespace(ndim=2, shape=(2, 2)))
    with pytest.raises(ValueError, match=r"2-D DeviceMesh \(2, 2\); Dion2 supports 1-D meshes only"):
        one_dim_mesh("param group 0", 0, square)


def test_nordion2_passes_an_empty_row_shard_through():
    """NorDion2's row normalisation of no rows (a rank's empty Shard(0) piece, or an empty megabatch) returns them
    as they are, with no state to read (the guard mutated to `numel() < 0` ran on and failed)."""
    from optimizers.algorithms.dion2 import normalise_selected_rows
    empty = torch.zeros(0, 6, 4)
    out = normalise_selected_rows(empty, [], {"flatten": False, "beta2": 0.95, "variance_eps": 1e-8})
    assert out is empty
