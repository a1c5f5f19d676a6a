"""NorMuon: per-output-channel variance under flatten, the FP64 oracle, controls, checkpoints."""

import copy
import math

import numpy as np
import pytest
import torch
from snapshots import rejected_load_problems

from cases import Case
from harness.runner import run_case
from harness.targets import load_target
from optimizers import Muon, NorMuon
from optimizers.algorithms.normuon import normalise_rows, restore_factor, variance_shape
from optimizers.checkpoint import LAYOUT_VERSION
from oracles import Conventions, NorMuonHyper, Orthogonalizer, initial_variance, reference_normuon_step

CONV = "normuon/conv2d-8x4x3x3/mb3/flat/fp32@fp32/pe/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0"


def conv_params(n=2, shape=(8, 4, 3, 3), seed=0):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(*shape, generator=g, dtype=torch.float64)) for _ in range(n)]
    for p in ps:
        p.grad = torch.randn(*shape, generator=g, dtype=torch.float64)
    return ps


def test_variance_is_one_value_per_output_channel_at_parameter_rank():
    assert variance_shape((8, 4, 3, 3), True) == (8, 1, 1, 1)
    assert variance_shape((8, 4, 3, 3), False) == (8, 4, 3, 1)
    assert variance_shape((12, 20), True) == variance_shape((12, 20), False) == (12, 1)
    ps = conv_params()
    opt = NorMuon(ps, flatten=True)
    opt.step()
    assert all(opt.state[p]["variance"].shape == (8, 1, 1, 1) for p in ps)


def test_flattened_conv_equals_the_equivalent_matrix_over_several_steps():
    conv = conv_params(seed=3)
    mats = [torch.nn.Parameter(p.detach().reshape(8, 36).clone()) for p in conv]
    opt_c = NorMuon(conv, flatten=True, compute_dtype=torch.float64)
    opt_m = NorMuon(mats, flatten=True, compute_dtype=torch.float64)
    g = torch.Generator().manual_seed(9)
    for _ in range(3):
        for c, m in zip(conv, mats):
            c.grad = torch.randn(c.shape, generator=g, dtype=torch.float64)
            m.grad = c.grad.reshape(8, 36).clone()
        opt_c.step()
        opt_m.step()
    torch.set_num_threads(1)
    for c, m in zip(conv, mats):
        assert torch.equal(c.detach().reshape(8, 36), m.detach())
        assert torch.equal(opt_c.state[c]["variance"].reshape(8, 1), opt_m.state[m]["variance"])


@pytest.mark.parametrize("option, value", [("beta2", -0.5), ("beta2", 1.0), ("beta2", math.nan),
                                           ("variance_eps", -1e-3), ("variance_eps", math.inf)])
def test_variance_options_outside_their_range_are_refused_at_construction(option, value):
    """beta2 in [0, 1), variance_eps finite and >= 0: anything else is a ValueError naming the option (the lower
    bounds' mutants survived every case, which never passes a bad value)."""
    p = torch.nn.Parameter(torch.randn(4, 6))
    with pytest.raises(ValueError, match=option):
        NorMuon([p], **{option: value})


def test_oracle_normalises_rows_and_restores_the_norm():
    o = np.random.default_rng(0).standard_normal((4, 6)) * np.array([[1.0], [2.0], [3.0], [4.0]])
    hyper = NorMuonHyper(0.1, 0.0, False, 0.0, True, beta2=0.0, variance_eps=0.0)
    conv = Conventions(Orthogonalizer.named("svd", compute_dtype="fp64"), compute_dtype="fp64", lr_scale="none")
    x1, _, v = reference_normuon_step(np.zeros((4, 6)), np.zeros((4, 6)), initial_variance((4, 6), True), o, hyper, conv)
    update = -x1 / 0.1
    rms = np.sqrt(np.mean(update**2, axis=1))
    np.testing.assert_allclose(rms, rms[0], rtol=1e-12)  # every row equalised
    np.testing.assert_allclose(np.linalg.norm(update), np.sqrt(4.0), rtol=1e-12)  # ||U V^T||_F restored
    assert v.shape == (1, 4)


def test_oracle_flags_a_kernel_slice_variance():
    """Negative control of the oracle: per-kernel-slice statistics give a different step."""
    rng = np.random.default_rng(1)
    x, g = rng.standard_normal((8, 4, 3, 3)), rng.standard_normal((8, 4, 3, 3))
    conv = Conventions(Orthogonalizer.named("polar_express"), compute_dtype="fp64")
    flat = NorMuonHyper(0.02, 0.95, False, 0.0, True)
    noflat = NorMuonHyper(0.02, 0.95, False, 0.0, False)
    a, _, _ = reference_normuon_step(x, 0 * x, initial_variance(x.shape, True), g, flat, conv)
    b, _, _ = reference_normuon_step(x, 0 * x, initial_variance(x.shape, False), g, noflat, conv)
    assert np.linalg.norm(a - b) / np.linalg.norm(a - x) > 0.1


@pytest.mark.parametrize("control", ["control-normuon-kernel-slice", "control-normuon-trailing-dims"])
def test_normuon_controls_are_flagged(control):
    got = {r.check: r for r in run_case(Case.from_id(CONV), load_target(control), control)}
    assert got["reference"].status == "fail"
    ours = run_case(Case.from_id(CONV), load_target("ours"), "ours")
    assert all(r.status == "pass" for r in ours)


def test_normuon_controls_are_correct_without_flatten():
    """flatten=False is the batch-of-trailing-matrices semantics, where param[..., 0:1] is right."""
    case = Case.from_id(CONV.replace("/flat/", "/noflat/"))
    assert all(r.status == "pass" for r in run_case(case, load_target("control-normuon-kernel-slice"),
                                                "control-normuon-kernel-slice"))


# --- checkpoints -------------------------------------------------------------------------------

def stepped(seed=0, shape=(8, 4, 1, 1)):
    ps = conv_params(shape=shape, seed=seed)
    opt = NorMuon(ps, flatten=True)
    opt.step()
    return ps, opt


def legacy(state):
    """The pre-fix layout: no version, variance shaped param[..., 0:1]."""
    bad = copy.deepcopy(state)
    del bad["layout_version"]
    for entry in bad["state"].values():
        entry["variance"] = torch.zeros(8, 4, 1, 1, dtype=torch.float64)
    return bad


def test_state_round_trip_with_the_layout_version():
    ps, opt = stepped()
    state = copy.deepcopy(opt.state_dict())
    assert state["layout_version"] == LAYOUT_VERSION
    fresh = NorMuon([torch.nn.Parameter(p.detach().clone()) for p in ps], flatten=True)
    fresh.load_state_dict(state)


@pytest.mark.parametrize("version", [np.int64(LAYOUT_VERSION), torch.tensor(LAYOUT_VERSION)])
def test_versions_that_round_trip_as_numpy_or_tensor_integers_load(version):
    ps, opt = stepped()
    state = copy.deepcopy(opt.state_dict())
    state["layout_version"] = version
    NorMuon([torch.nn.Parameter(p.detach().clone()) for p in ps], flatten=True).load_state_dict(state)


def break_version(value):
    def mutate(state):
        state["layout_version"] = value
        return state
    return mutate


def drop_variance(state):
    for entry in state["state"].values():
        del entry["variance"]
    return state


def coinciding_legacy(state):
    """Kernel 1x1 with in=1 would give legacy variance shape == new shape: only the version tells."""
    del state["layout_version"]
    return state


@pytest.mark.parametrize("corrupt,match", [
    (legacy, "legacy"),
    (coinciding_legacy, "legacy"),
    (break_version(1), "layout version 1"),
    (break_version(2.0), "integer"),
    (break_version("2"), "integer"),
    (break_version(True), "integer"),
    (drop_variance, "lacks"),
])
def test_bad_states_are_rejected_before_anything_changes(corrupt, match):
    ps, opt = stepped()
    bad = corrupt(copy.deepcopy(opt.state_dict()))
    with pytest.raises(ValueError, match=match):
        copy.deepcopy(opt).load_state_dict(bad)
    assert rejected_load_problems(opt, bad) == []


def test_optimizer_keeps_stepping_correctly_after_a_rejected_load():
    ps, opt = stepped(seed=4)
    twin = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    twin_opt = NorMuon(twin, flatten=True)
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert rejected_load_problems(opt, legacy(opt.state_dict())) == []
    g = torch.Generator().manual_seed(5)
    for p, q in zip(ps, twin):
        p.grad = torch.randn(p.shape, generator=g, dtype=torch.float64)
        q.grad = p.grad.clone()
    opt.step()
    twin_opt.step()
    assert all(torch.equal(p, q) for p, q in zip(ps, twin))


class _MutatesThenFails(NorMuon):
    """Negative control: loads first, validates after, so a rejected load has already clobbered state."""

    def load_state_dict(self, state_dict):
        torch.optim.Optimizer.load_state_dict(self, {k: v for k, v in state_dict.items() if k != "layout_version"})
        if "layout_version" not in state_dict:
            raise ValueError("legacy layout")


def test_checkpoint_check_flags_a_load_that_mutates_before_failing():
    ps = conv_params(shape=(8, 4, 1, 1))
    opt = _MutatesThenFails(ps, flatten=True)
    opt.step()
    problems = rejected_load_problems(opt, legacy(opt.state_dict()))
    assert any("variance" in p for p in problems)


def test_muon_states_are_versioned_too():
    ps = conv_params()
    opt = Muon(ps)
    opt.step()
    state = copy.deepcopy(opt.state_dict())
    del state["layout_version"]
    assert rejected_load_problems(opt, state) == []


def test_a_checkpoint_with_a_negative_variance_is_refused():
    """The row second moment is a mean of squares: a checkpoint holding a negative one (its square root would
    be NaN) is refused on load, the optimizer untouched (the `nonnegative` flag's mutant survived every case)."""
    p = torch.nn.Parameter(torch.randn(8, 6))
    opt = NorMuon([p])
    p.grad = torch.randn(8, 6)
    opt.step()
    saved = opt.state_dict()
    bad = copy.deepcopy(saved)
    next(iter(bad["state"].values()))["variance"][0] = -1.0
    with pytest.raises(ValueError, match="variance"):
        opt.load_state_dict(bad)
    assert torch.equal(opt.state[p]["variance"], next(iter(saved["state"].values()))["variance"])


def test_the_restore_factor_is_the_norm_ratio_and_zero_only_for_a_zero_normalised_update():
    """||O|| / ||N|| per matrix: a normalised norm of exactly 1 restores by ||O|| (the `norm_n == 1` mutant zeroed
    it and survived every case), 0 where ||N|| = 0, NaN kept."""
    got = restore_factor(torch.tensor([[2.0], [3.0], [0.0], [math.nan]]), torch.tensor([[1.0], [4.0], [0.0], [2.0]]))
    assert got[:3].flatten().tolist() == [2.0, 0.75, 0.0] and got[3].isnan().all()


def test_an_empty_megabatch_is_returned_and_a_one_entry_parameter_still_updates_its_variance():
    """The empty-update guard returns an empty megabatch as it is (no variances to stack); a parameter of one
    entry is normalised like any other, its variance buffer updated (mutants of the guard, `numel() == 1` and
    guards never taken, survived every case)."""
    group = {"flatten": False, "beta2": 0.95, "variance_eps": 1e-8}
    empty = torch.empty(0, 4, 6)
    assert normalise_rows(empty, [], group) is empty
    variance = torch.zeros(1, 1)
    out = normalise_rows(torch.tensor([[[0.5]]]), [variance], group)
    assert variance.item() == pytest.approx(0.05 * 0.25) and out.item() == pytest.approx(0.5)
