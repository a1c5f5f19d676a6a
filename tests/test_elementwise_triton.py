"""The fused elementwise kernels (optimizers/elementwise_triton.py, taken under a group's `fused` option):
Muon with them steps to the same bits as with the torch passes, on every path that reaches them (direct
half-precision apply, wide and tall, flattened and sliced convolutions, Gram Newton-Schulz iterating in
fp16, NorMuon's fp32 apply, Nesterov), and they decline, changing nothing, where they cannot run. Skipped
without triton; on CPU under Triton's interpreter, on CUDA at sizes of real layers too. The symmetric products
stay torch's here (`fused` fixture), so that a comparison isolates the elementwise kernels."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # before triton's import, which reads it (this process has no GPU to leak to)
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

import optimizers  # noqa: E402
from optimizers import elementwise, launches, norms, symmetric  # noqa: E402
from optimizers.kernels import TORCH, Kernels  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = [(12, 20), (12, 20), (30, 8), (30, 8), (6, 4, 3, 3), (6, 4, 3, 3), (16, 16)]
"""Wide and tall megabatches of two, a conv megabatch, and a single square matrix."""


ANY_SIZE = Kernels(on=True, sized=False)
"""What fused=True takes on this device: the kernels at every size."""


@pytest.fixture
def fused(monkeypatch):
    """Counts the elementwise kernels' launches; the symmetric products stay torch's (their kernel rounds W
    once: tests/test_symmetric_triton.py), so that fused=True against fused=False compares these kernels only."""
    from optimizers import elementwise_triton as kernels
    monkeypatch.setattr(symmetric, "_kernel_for", lambda a, chosen: None)
    calls = {"momentum": 0, "apply": 0, "divide": 0}
    for name in calls:
        name = f"{name}_" if name != "divide" else name
        original = getattr(kernels, name)

        def counted(*args, _name=name.rstrip("_"), _original=original):
            calls[_name] += not launches.noting()  # not a step's rehearsal (optimizers/launches.py)
            return _original(*args)
        monkeypatch.setattr(kernels, name, counted)
    return calls


def trajectory(fused, shapes, steps=3, algorithm=optimizers.Muon, **options):
    """The parameters after `steps` steps of seeded gradients, with the group option `fused`."""
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=g).to(DEVICE)) for s in shapes]
    opt = algorithm(params, lr=0.02, fused=fused, **options)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(DEVICE)
        opt.step()
    return [p.detach().cpu() for p in params]


CONFIGS = [
    dict(orthogonalizer="polar_express", compute_dtype=torch.bfloat16, weight_decay=0.1, flatten=True),
    dict(orthogonalizer="polar_express", compute_dtype=torch.bfloat16, weight_decay=0.0, flatten=False),
    dict(orthogonalizer="newton_schulz", compute_dtype=torch.float32, weight_decay=0.1, flatten=True, nesterov=True),
    dict(orthogonalizer="gram_newton_schulz", compute_dtype=torch.bfloat16, weight_decay=0.1, flatten=True),
    dict(orthogonalizer="gram_newton_schulz", compute_dtype=torch.float16, weight_decay=0.0, flatten=True),
]


def exact_frobenius(x: torch.Tensor, dim, keepdim: bool = False) -> torch.Tensor:
    """The norm the fused momentum launch forms: each square exact in fp64, summed in fp64, the root
    rounded once to x's dtype."""
    return x.double().square().sum(dim=dim, keepdim=keepdim).sqrt().to(x.dtype)


@pytest.fixture
def gram_norms(monkeypatch):
    """Gram Newton-Schulz's normaliser forms `exact_frobenius` (torch's fp32 reduction rounds its sum
    differently, ~1e-7 relative at real sizes): a run with the kernels, which take the momentum launch's
    norms where they can, then has the torch passes' bits. Counts the norms Gram formed itself (matrices; not
    in a step's rehearsal on meta tensors, optimizers/launches.py)."""
    formed = []

    def counted(x, dim, keepdim=False):
        if not x.is_meta:
            formed.append(x.size(0))
        return exact_frobenius(x, dim, keepdim)
    monkeypatch.setattr(norms, "frobenius", counted)  # the normaliser's (norms.scaled_and_cast)
    return formed


@pytest.mark.parametrize("options", CONFIGS, ids=lambda o: f"{o['orthogonalizer']}-{o['compute_dtype']}-wd{o['weight_decay']}")
def test_muon_with_the_kernels_steps_to_the_torch_passes_bits(options, fused, gram_norms):
    # eager steps: on CUDA a plan's graph warms up and captures each update (two more runs of it, which the
    # count of the norms Gram forms would see); graphs against eager steps: tests/test_perf_cuda.py
    options = dict(options, cuda_graphs=False)
    torch_passes = trajectory(False, SHAPES, **options)
    formed_by_torch_passes = sum(gram_norms)
    gram_norms.clear()
    kernels = trajectory(True, SHAPES, **options)
    assert fused["momentum"] == 3 and fused["apply"] == 3 * 4, fused  # one momentum launch, one per megabatch
    if options["orthogonalizer"] == "gram_newton_schulz":  # the megabatches of two divide by the launch's norms
        assert formed_by_torch_passes == 3 * len(SHAPES) and sum(gram_norms) == 3 * 1, gram_norms
    for i, (a, b) in enumerate(zip(torch_passes, kernels)):
        assert torch.equal(a, b), f"parameter {i} {tuple(a.shape)}: max |diff| {(a - b).abs().max().item():.3g}"


def test_the_momentum_launch_forms_each_new_buffers_norm(fused, monkeypatch):
    """`momentum_`'s sums of squares in parts, many programs per tensor and several loop turns each (small
    blocks), masked tails: `norms` gives each new M's `exact_frobenius` (to an ulp: the fp64 sums are rounded
    in another order), within 2 ulp of torch's fp32 norm; not the old M's."""
    from optimizers import elementwise_triton as kernels
    monkeypatch.setattr(kernels, "BLOCK", 16)
    monkeypatch.setattr(kernels, "PROGRAMS", 3)
    g = torch.Generator().manual_seed(5)
    shapes = [(7, 13), (200,), (3, 5, 4), (1,)]
    bufs = [torch.randn(s, generator=g).to(DEVICE) for s in shapes]
    grads = [torch.randn(s, generator=g).to(DEVICE) for s in shapes]
    old = [exact_frobenius(b, tuple(range(b.ndim))) for b in bufs]
    parts = elementwise.momentum_(bufs, grads, 0.9, ANY_SIZE)
    assert parts.shape == (4, 3) and parts.dtype == torch.float64 and fused["momentum"] == 1
    assert elementwise.norms(parts).dtype == torch.float64  # left in fp64: the normaliser scales, then rounds
    got = elementwise.norms(parts).float()
    want = torch.stack([exact_frobenius(b, tuple(range(b.ndim))) for b in bufs])
    torch.testing.assert_close(got, want, rtol=2**-23, atol=0)
    torch.testing.assert_close(got, torch.stack([torch.linalg.vector_norm(b) for b in bufs]), rtol=2**-22, atol=0)
    assert not torch.allclose(got, torch.stack(old), rtol=1e-3)


def test_normuon_fp32_apply_takes_the_kernel_with_the_same_bits(fused):
    options = dict(orthogonalizer="polar_express", compute_dtype=torch.bfloat16, weight_decay=0.1, flatten=True)
    a = trajectory(False, SHAPES, algorithm=optimizers.NorMuon, **options)
    b = trajectory(True, SHAPES, algorithm=optimizers.NorMuon, **options)
    assert fused["apply"] == 3 * 4
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_the_kernels_decline_what_they_cannot_run_and_change_nothing(fused):
    """fp64 and bf16 parameters, and matrices that do not fit the parameters: False, nothing written; and
    nothing at all where the call's kernels are off (fused=False)."""
    x64 = torch.ones(4, 6, dtype=torch.float64, device=DEVICE)
    assert not elementwise.momentum_([x64], [x64.clone()], 0.9, ANY_SIZE)
    assert not elementwise.apply_([x64], torch.ones(1, 4, 6, device=DEVICE), 0.5, 1.0, ANY_SIZE)
    x = torch.ones(4, 6, device=DEVICE)
    assert not elementwise.apply_([x], torch.ones(1, 4, 5, device=DEVICE), 0.5, 1.0, ANY_SIZE)  # 20 elements for 24
    assert not elementwise.apply_([x], torch.ones(1, 4, 6, dtype=torch.float64, device=DEVICE), 0.5, 1.0, ANY_SIZE)
    assert not elementwise.apply_([x], torch.ones(1, 4, 6, device=DEVICE), 0.5, 1.0, TORCH)
    assert elementwise.momentum_([x], [x.clone()], 0.9, TORCH) is None
    assert torch.equal(x, torch.ones(4, 6, device=DEVICE)) and torch.equal(x64, torch.ones_like(x64))
    assert fused == {"momentum": 0, "apply": 0, "divide": 0}
    bf16 = optimizers.Muon([torch.nn.Parameter(torch.ones(8, 4, dtype=torch.bfloat16, device=DEVICE))], fused=True)
    bf16.param_groups[0]["params"][0].grad = torch.ones(8, 4, dtype=torch.bfloat16, device=DEVICE)
    bf16.step()  # bf16 parameters step by the torch passes (the normaliser's division of its bf16 cast may not)
    assert fused["momentum"] == 0 and fused["apply"] == 0


def test_fused_false_never_runs_the_kernels(fused):
    trajectory(False, SHAPES[:2], orthogonalizer="polar_express")
    assert fused == {"momentum": 0, "apply": 0, "divide": 0}


def test_sized_kernels_keep_the_torch_passes_below_min_numel(fused, monkeypatch):
    """The kernels fused=None takes (on CUDA: optimizers/kernels.py) run a launch of MIN_NUMEL elements or more
    (host-bound below: the launch costs more than it saves); fused=True's at any size."""
    monkeypatch.setattr(elementwise, "MIN_NUMEL", 48)
    bufs = [torch.zeros(4, 6, device=DEVICE) for _ in range(2)]
    grads = [torch.ones(4, 6, device=DEVICE) for _ in range(2)]
    sized = Kernels(on=True)
    assert elementwise.momentum_(bufs[:1], grads[:1], 0.9, sized) is None  # 24 elements
    assert torch.equal(bufs[0], torch.zeros(4, 6, device=DEVICE)) and fused["momentum"] == 0
    assert elementwise.momentum_(bufs, grads, 0.9, sized) is not None  # 48
    assert elementwise.momentum_(bufs[:1], grads[:1], 0.9, ANY_SIZE) is not None
    assert fused["momentum"] == 2 and torch.equal(bufs[1], grads[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_divide_rounds_as_torch_div_into_a_half_type(fused, dtype, layout):
    """Gram Newton-Schulz's normaliser X / d per matrix, rounded to bf16/fp16, row- or column-major (a tall
    matrix's transpose): torch.div's bits and strides, from one launch."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 20, 7, generator=g) * 300).to(DEVICE)
    x = x.mT if layout == "columns" else x.transpose(-2, -1).contiguous()
    d = (torch.rand(3, 1, 1, generator=g) * 5 + 0.1).to(DEVICE)
    got = elementwise.divide(x, d, dtype, ANY_SIZE)
    assert (elementwise.divide(x.double(), d, dtype, ANY_SIZE) is None
            and elementwise.divide(x[:, :, :3], d, dtype, ANY_SIZE) is None)
    want = torch.div(x, d, out=torch.empty_like(x, dtype=dtype))
    if dtype == torch.bfloat16 and DEVICE == "cpu":  # the interpreter's bf16 conversion truncates: declined
        assert got is None and fused["divide"] == 0
        return
    assert fused["divide"] == 1 and got.stride() == want.stride() and torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_divide_of_a_half_type_cast_rounds_as_torch_div(fused, dtype, layout):
    """Polar Express's normaliser: its cast X in bf16/fp16 divided by a denominator d of the same dtype, as
    `x / d` rounds it (both widened to fp32, the quotient rounded once), subnormal and large quotients too,
    row- or column-major, from one launch; a mixed pair (half x, fp32 d; fp32 x, half d) or factors on a half x
    are declined."""
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(3, 20, 7, generator=g) * 30).to(dtype)
    x[0, :2] *= 2.0 ** -12
    x = x.to(DEVICE)
    x = x.mT if layout == "columns" else x.transpose(-2, -1).contiguous()
    d = torch.tensor([3.0, 0.37, 2.0 ** -9]).view(3, 1, 1).to(dtype).to(DEVICE)
    got = elementwise.divide(x, d, dtype, ANY_SIZE)
    assert (elementwise.divide(x, d.float(), dtype, ANY_SIZE) is None
            and elementwise.divide(x.float(), d, dtype, ANY_SIZE) is None
            and elementwise.divide(x, d, dtype, ANY_SIZE, torch.ones(3, 1, 1, device=DEVICE)) is None)
    want = x / d
    if dtype == torch.bfloat16 and DEVICE == "cpu":  # the interpreter's bf16 conversion truncates: declined
        assert got is None and fused["divide"] == 0
        return
    assert fused["divide"] == 1 and got.dtype == dtype and got.stride() == want.stride() and torch.equal(got, want)


@pytest.mark.parametrize("factor_dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_divide_with_factors_gives_the_bits_of_the_scaling_mul_then_the_division(fused, factor_dtype, layout):
    """Gram Newton-Schulz's normaliser by known norms: (X f) / d, f the power of two that keeps the norm in range
    (1, 2^-100, and 2^-140 where the products fall into fp32's subnormals; NaN for an infinite norm), in one
    launch: the bits of torch.mul(X, f, out=fp32) then torch.div(., d, out=fp16) (fp16: the interpreter declines
    bf16)."""
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(4, 20, 7, generator=g) * 300).to(DEVICE)
    x[1] *= 2.0 ** 100
    x = x.mT if layout == "columns" else x.transpose(-2, -1).contiguous()
    d = (torch.rand(4, 1, 1, generator=g) * 5 + 0.1).to(DEVICE)
    f = torch.tensor([1.0, 2.0 ** -100, 2.0 ** -140, float("nan")], dtype=torch.float64).view(4, 1, 1)
    f = f.to(factor_dtype).to(DEVICE)
    got = elementwise.divide(x, d, torch.float16, ANY_SIZE, f)
    scaled = torch.mul(x, f, out=torch.empty_like(x))
    want = torch.div(scaled, d, out=torch.empty_like(x, dtype=torch.float16))
    assert fused["divide"] == 1 and got.stride() == want.stride()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~got.isnan()], want[~want.isnan()])
    assert elementwise.divide(x, d, torch.float16, ANY_SIZE, f.half()) is None  # a factor dtype it does not take


@pytest.mark.skipif(not torch.cuda.is_available(), reason="real layer sizes: CUDA")
@pytest.mark.parametrize("orthogonalizer", ["polar_express", "gram_newton_schulz"])
def test_real_layer_sizes_on_cuda(orthogonalizer, fused, gram_norms):
    """GPT-2-sized wide and tall megabatches (the direct half-precision apply of tall results too)."""
    shapes = [(768, 2304), (768, 2304), (3072, 768), (3072, 768), (768, 768)]
    options = dict(orthogonalizer=orthogonalizer, weight_decay=0.1, flatten=True)
    a = trajectory(False, shapes, steps=2, **options)
    b = trajectory(True, shapes, steps=2, **options)
    assert fused["apply"] == 2 * 3
    assert all(torch.equal(x, y) for x, y in zip(a, b))
