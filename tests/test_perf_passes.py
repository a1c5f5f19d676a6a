"""Issue 13's elementwise passes: each fused or batched form gives the bits of the form it replaces,
and one step launches the kernels it should (counted on CPU, benchmarks/step_kernels.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from optimizers import Muon
from optimizers.algorithms.base import decoupled_apply, decoupled_apply_all
from optimizers.algorithms.muon import momentum_direction, momentum_directions
from optimizers.coefficients import NEWTON_SCHULZ_QUINTIC, POLAR_EXPRESS
from optimizers.gram_newton_schulz import normalised, plus_identity
from optimizers.norms import frobenius
from optimizers.orthogonalize import orthogonalize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_step  # noqa: E402
import step_kernels  # noqa: E402

SHAPES = [(12, 5), (5, 12), (7, 7), (3, 4, 2, 2)]


def tensors(dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(s, generator=g) * scale).to(dtype) for s in SHAPES]


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_momentum_directions_are_the_per_parameter_bits(nesterov, dtype):
    group = {"momentum": 0.95, "nesterov": nesterov, "fused": None}
    grads, bufs = tensors(dtype, 1), tensors(dtype, 2)
    states = [{"momentum_buffer": b.clone()} for b in bufs]
    expected_states = [{"momentum_buffer": b.clone()} for b in bufs]
    got, parts = momentum_directions(grads, states, group)
    assert parts is None  # the torch passes (no kernel on a CPU by default) form no sums of squares
    expected = [momentum_direction(g, s, group) for g, s in zip(grads, expected_states)]
    for a, b, s, t in zip(got, expected, states, expected_states):
        assert torch.equal(a, b) and torch.equal(s["momentum_buffer"], t["momentum_buffer"])
    if not nesterov:  # the direction is the buffer itself, as per parameter
        assert all(d is s["momentum_buffer"] for d, s in zip(got, states))
    assert momentum_directions([], [], group) == ([], None)
    fused_off = momentum_directions(grads, [{"momentum_buffer": b.clone()} for b in bufs], {**group, "fused": False})
    assert all(torch.equal(a, b) for a, b in zip(fused_off[0], got)) and fused_off[1] is None


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_decoupled_apply_all_is_the_per_parameter_bits(weight_decay):
    group = {"lr": 0.02, "weight_decay": weight_decay}
    xs, updates = tensors(seed=3), tensors(seed=4)
    ys = [x.clone() for x in xs]
    decoupled_apply_all(xs, updates, group, 1.7)
    for y, u in zip(ys, updates):
        decoupled_apply(y, u, {}, group, 1.7)
    assert all(torch.equal(x, y) for x, y in zip(xs, ys))
    decoupled_apply_all([], [], group, 1.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("a", [c[0] / 1.01 for c in POLAR_EXPRESS] + [NEWTON_SCHULZ_QUINTIC[0]])
def test_plus_identity_rounds_as_adding_a_scaled_identity(dtype, a):
    z = torch.randn(3, 9, 9, generator=torch.Generator().manual_seed(5)).to(dtype)
    eye = torch.eye(9, dtype=dtype).expand(3, -1, -1)
    assert torch.equal(plus_identity(z, a), z + a * eye)


@pytest.mark.parametrize("compute", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("tall", [False, True])
def test_normalised_in_one_pass_is_the_two_pass_bits_and_layout(compute, dtype, tall):
    """Divide in >= fp32, round to the compute dtype as it is written: what dividing and then casting
    gave, in the same memory layout (a tall matrix's transposed view stays one)."""
    x = (torch.randn(4, 9, 21, generator=torch.Generator().manual_seed(6)) * 1e3).to(dtype)
    x = x.mT if tall else x
    wide = x.to(torch.promote_types(dtype, torch.float32))
    norm = frobenius(wide, (-2, -1), keepdim=True)
    expected = (wide / (norm * 1.01 + 1e-7)).to(compute)
    got = normalised(x, 1.01, 1e-7, compute)
    assert got.dtype == compute and torch.equal(got, expected) and got.stride() == expected.stride()


@pytest.mark.parametrize("name", ["polar_express", "newton_schulz", "gram_newton_schulz", "svd"])
def test_a_tall_result_comes_back_row_major_in_the_input_dtype(name):
    """The result of a tall stack, computed as its transpose, is cast back into a contiguous tensor
    (the apply then reads it coalesced); its values are the transposed computation's."""
    x = torch.randn(3, 40, 12, generator=torch.Generator().manual_seed(7))
    out = orthogonalize(x, name, 5, 1e-7, torch.bfloat16)
    assert out.dtype == torch.float32 and out.is_contiguous()
    same = orthogonalize(x, name, 5, 1e-7, torch.float32)  # no cast: returned as computed
    assert same.dtype == torch.float32


def test_one_gpt2_like_step_launches_few_kernels():
    """Kernels of one step on GPT-2 small's 48 matrices (scaled down; CPU profiler): momentum and the
    apply are foreach passes (not two and one per parameter), the normaliser's divide and cast one
    pass, no identity matrix formed. Before issue 13's pass cuts: 274 (Gram NS) and 232 (Polar Express); the
    overflow-safe normaliser (issue 30 item 9: a max-abs reduction, the power of two, its scaling) adds 19 to
    Gram NS's 130 and 14 to Polar Express's 100 on their 4 megabatches."""
    counts = {}
    for name in ("gram_newton_schulz", "polar_express"):
        params = gpu_step.make_params(gpu_step.SETS["gpt2_small"](0.02), torch.device("cpu"))
        kernels, _ = step_kernels.count(Muon(params, flatten=True, orthogonalizer=name,
                                             compute_dtype=torch.bfloat16))
        counts[name] = kernels
        assert kernels["aten::add_"] + kernels["aten::mul_"] <= 12, kernels  # diagonal adds only
        assert kernels["aten::eye"] == 0 and kernels["aten::_foreach_add_"] >= 1, kernels
    assert sum(counts["gram_newton_schulz"].values()) <= 149, counts
    assert sum(counts["polar_express"].values()) <= 114, counts


def _step_three(opt, params, seed=8):
    g = torch.Generator().manual_seed(seed)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("name", ["gram_newton_schulz", "polar_express"])
def test_momentum_block_is_read_in_place_of_a_stack_with_the_same_bits(name, nesterov):
    """A megabatch's fresh momentum buffers are rows of one block, which (without Nesterov) is the
    stack itself: no copy, and the same parameters and buffers as separately created buffers give."""
    shapes = [(12, 5)] * 3 + [(5, 12)] * 2 + [(7, 7)]
    runs = []
    for separate in (False, True):
        g = torch.Generator().manual_seed(9)
        params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
        opt = Muon(params, orthogonalizer=name, nesterov=nesterov, weight_decay=0.1)
        if separate:
            for p in params:
                opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
        _step_three(opt, params)
        runs.append((params, opt))
    (blocked, opt), (separate, opt_separate) = runs
    bufs = [opt.state[p]["momentum_buffer"] for p in blocked]
    assert bufs[0]._base is not None and all(b._base is bufs[0]._base for b in bufs[:3])
    assert bufs[3]._base is bufs[4]._base is not bufs[0]._base and bufs[5]._base is None  # one alone: no block
    for p, q in zip(blocked, separate):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["momentum_buffer"], opt_separate.state[q]["momentum_buffer"])


def test_a_blocked_state_round_trips_through_a_checkpoint():
    shapes = [(12, 5)] * 3
    runs = []
    for reload in (False, True):
        g = torch.Generator().manual_seed(10)
        params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
        opt = Muon(params, orthogonalizer="gram_newton_schulz")
        _step_three(opt, params)
        if reload:
            saved = opt.state_dict()
            opt = Muon(params, orthogonalizer="gram_newton_schulz")
            opt.load_state_dict(saved)
        _step_three(opt, params, seed=11)
        runs.append(params)
    assert all(torch.equal(p, q) for p, q in zip(*runs))


@pytest.mark.parametrize("name", ["gram_newton_schulz", "polar_express", "svd"])
@pytest.mark.parametrize("compute", [torch.bfloat16, torch.float16])
def test_a_large_wide_result_is_applied_in_the_compute_dtype_with_the_same_bits(monkeypatch, name, compute):
    """Parameters of DIRECT_APPLY_NUMEL elements or more (lowered here) apply a bf16/fp16 result without
    casting it back first, wide and square matrices only: the same parameters and buffers as the cast."""
    from optimizers import plan

    shapes = [(5, 12)] * 3 + [(7, 7)] * 2 + [(12, 5)] * 2 + [(4, 3, 2, 2)] * 2
    runs = []
    for threshold in (1 << 62, 1):
        monkeypatch.setattr(plan, "DIRECT_APPLY_NUMEL", threshold)
        g = torch.Generator().manual_seed(12)
        params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
        opt = Muon(params, orthogonalizer=name, compute_dtype=compute, weight_decay=0.1, flatten=True)
        _step_three(opt, params)
        runs.append((params, opt))
    (cast, _), (direct, _) = runs
    assert all(torch.equal(p, q) for p, q in zip(cast, direct))
    example = torch.zeros(5, 12)  # one member
    group = {**runs[1][1].param_groups[0], "orthogonalizer": "polar_express"}

    def direct(record, group, member, fused=False):
        return plan.direct_dtype(plan.paths(record, group), group, member, fused)
    assert direct(MUON_RECORD, group, example) == compute
    gram = {**group, "orthogonalizer": "gram_newton_schulz"}  # bf16 iterates in fp16: a shape-dependent dtype
    assert direct(MUON_RECORD, gram, example) == (compute if compute == torch.float16 else None)
    assert direct(MUON_RECORD, group, example.mT.contiguous()) is None  # tall: cast back
    assert direct(MUON_RECORD, group, example.double()) == compute
    assert direct(MUON_RECORD, {**group, "compute_dtype": torch.float32}, example) is None
    assert direct(NORMUON_RECORD, group, example) is None  # a postprocess reads the result
    assert direct(MUON_RECORD, {**group, "orthogonalizer": "svd"}, example) is None  # svd: fp32 result
    # the fused apply (optimizers/elementwise.py) reads tall results where they lie, at every size, and a Gram
    # result in its iteration dtype (square matrices take the standard iteration, in the compute dtype)
    monkeypatch.setattr(plan, "DIRECT_APPLY_NUMEL", 1 << 62)
    assert direct(MUON_RECORD, group, example) is None
    assert direct(MUON_RECORD, group, example.mT.contiguous(), fused=True) == compute
    assert direct(MUON_RECORD, gram, example, fused=True) == torch.float16
    assert direct(MUON_RECORD, gram, torch.zeros(7, 7), fused=True) == compute
    assert direct(NORMUON_RECORD, group, example, fused=True) is None


from optimizers import MUON as MUON_RECORD  # noqa: E402
from optimizers import NORMUON as NORMUON_RECORD
