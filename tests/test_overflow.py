"""The overflow-safe normaliser (optimizers/norms.py): gradients up to each dtype's range step exactly as the
unscaled ones (the scale relation), and every ordinary input keeps the bits of the unscaled normaliser."""

import math

import pytest
import torch

import optimizers
from optimizers import gram_newton_schulz as gram
from optimizers.algorithms.dion2 import reduced_dims, slice_norms, top_k_mask
from optimizers.coefficients import normaliser_scale, schedule
from optimizers.norms import entry_limit, frobenius
from optimizers.orthogonalize import orthogonalize, polar_via_svd

GEN = torch.Generator().manual_seed(11)


def stacks():
    """Ordinary inputs: Gaussian wide, tall, square and batched stacks at the tiers' scales, a zero and a
    rank-deficient matrix."""
    out = {}
    for shape in ((3, 12, 20), (2, 24, 6), (2, 8, 8), (1, 64, 256)):
        g = torch.randn(shape, generator=GEN, dtype=torch.float64)
        for scale in (1e-10, 1.0, 1e10):
            out[f"{shape}-{scale:g}"] = g * scale
    low = torch.randn(2, 12, 3, generator=GEN, dtype=torch.float64) @ torch.randn(2, 3, 20, generator=GEN,
                                                                                  dtype=torch.float64)
    out["rank3"] = low
    out["zero"] = torch.zeros(2, 12, 20, dtype=torch.float64)
    return out


STACKS = stacks()
DTYPES = (torch.float64, torch.float32, torch.bfloat16)
COMPUTE = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def unscaled_polynomial(x, name, steps, eps, compute):
    """The polynomial orthogonalizers' normaliser before it was overflow-safe: cast, norm, divide."""
    x = x.to(compute)
    tall = x.size(-2) > x.size(-1)
    x = x.mT if tall else x
    x = gram.standard_steps(x / (frobenius(x, (-2, -1), keepdim=True) * normaliser_scale(name) + eps),
                            schedule(name, steps))
    return gram.as_dtype(x.mT if tall else x, torch.float64)


def unscaled_normalised(x, scale, eps, compute, norms=None, norm=frobenius):
    """Gram Newton-Schulz's normaliser before it was overflow-safe (`norm`: how the norm is formed)."""
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    d = (norm(x, (-2, -1), keepdim=True) if norms is None else norms.view(-1, 1, 1)) * scale + eps
    return torch.div(x, d, out=torch.empty_like(x, dtype=compute))


@pytest.mark.parametrize("name", list(STACKS))
def test_ordinary_inputs_keep_the_unscaled_normalisers_bits(name):
    x64 = STACKS[name]
    for dtype in DTYPES:
        x = x64.to(dtype)
        for compute in COMPUTE:
            if compute == torch.float16 and name.endswith("1e+10"):
                continue  # not ordinary: the unscaled normaliser's cast to fp16 overflows (inf)
            for orth in ("polar_express", "newton_schulz"):
                got = orthogonalize(x, orth, 5, 1e-7, compute, out_dtype=torch.float64)
                assert torch.equal(got, unscaled_polynomial(x, orth, 5, 1e-7, compute)), (dtype, compute, orth)
            oriented = x.mT if x.size(-2) > x.size(-1) else x
            for scale in (1.0, 1.01):
                want = unscaled_normalised(oriented, scale, 1e-7, compute)
                assert torch.equal(gram.normalised(oriented, scale, 1e-7, compute), want), (dtype, compute)
                own = frobenius(oriented.to(torch.promote_types(dtype, torch.float32)), (-2, -1))
                for norms in (own, own.double()):
                    assert torch.equal(gram.normalised(oriented, scale, 1e-7, compute, norms),
                                       unscaled_normalised(oriented, scale, 1e-7, compute, own)), (dtype, compute)
        for svd in (torch.float32, torch.float64):
            assert torch.equal(orthogonalize(x, "svd", 5, 1e-7, svd), gram.as_dtype(polar_via_svd(x.to(svd)), dtype))


def test_the_bit_check_tells_a_normaliser_of_other_bits_apart():
    """Negative control: an overflow fix by an fp64 norm (no overflow in fp32's range either) changes the
    bits of ordinary inputs, and the comparison above sees it."""
    x = STACKS["(3, 12, 20)-1"].float()
    wide_norm = lambda t, dim, keepdim: torch.linalg.vector_norm(t.double(), dim=dim, keepdim=keepdim).float()
    assert not torch.equal(unscaled_normalised(x, 1.01, 1e-7, torch.float32, norm=wide_norm),
                           gram.normalised(x, 1.01, 1e-7, torch.float32))


def largest_scale(g, steps):
    """The largest k with 2^k g accumulated over `steps` momentum steps (at most steps x |g|) still finite."""
    return math.frexp(torch.finfo(g.dtype).max)[1] - math.frexp(steps * g.abs().max().item())[1]


ALGORITHMS = {
    "muon-pe": (optimizers.Muon, {}),
    "muon-ns": (optimizers.Muon, dict(orthogonalizer="newton_schulz")),
    "muon-gram": (optimizers.Muon, dict(orthogonalizer="gram_newton_schulz")),
    "muon-svd": (optimizers.Muon, dict(orthogonalizer="svd")),
    "muon-nesterov-batched": (optimizers.Muon, dict(nesterov=True)),
    "normuon": (optimizers.NorMuon, {}),
    "dion2": (optimizers.Dion2, dict(fraction=0.5)),
    "nordion2": (optimizers.NorDion2, dict(fraction=0.5)),
}
PAIRS = {"fp32": (torch.float32, torch.float32), "fp32@bf16": (torch.float32, torch.bfloat16),
         "bf16@fp32": (torch.bfloat16, torch.float32), "bf16": (torch.bfloat16, torch.bfloat16),
         "fp64": (torch.float64, torch.float64),
         "fp64@fp32": (torch.float64, torch.float32)}


def trajectory(cls, options, x, grads, dtype, compute):
    p = torch.nn.Parameter(x.to(dtype, copy=True))
    opt = cls([p], lr=0.02, eps=0.0, compute_dtype=compute, weight_decay=0.1, **options)
    out = []
    for g in grads:
        p.grad = g.to(dtype)
        opt.step()
        out.append(p.detach().clone())
    return out


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_scale_relation_holds_up_to_each_dtypes_range(algorithm, pair):
    """2^k G steps exactly as G (eps 0: the update is then invariant under any scale; a power of two scales
    every rounding with it) for k up to the dtype's range: 1e37 in fp32 and bf16, 1e307 in fp64; the SVD to
    its rounding (LAPACK scales a large matrix by a ratio that is no power of two). Before:
    an update of 0 from 2^57 (fp32: the sum of squares overflowed) and 2^505 (fp64), NaN beyond fp32's range
    for an fp64 parameter computing in fp32."""
    cls, options = ALGORITHMS[algorithm]
    dtype, compute = PAIRS[pair]
    gen = torch.Generator().manual_seed(1)
    shape = (6, 4, 5) if algorithm == "muon-nesterov-batched" else (12, 20)
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.02
    grads = [torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype) for _ in range(2)]
    want = trajectory(cls, options, x, grads, dtype, compute)
    assert all(torch.isfinite(p).all() for p in want) and not torch.equal(want[-1], x.to(dtype))
    top = largest_scale(grads[0], 3)
    for k in sorted({20, 60, 64, 100, 126, 500, 505, 600, 1000, top}):
        if k > top:
            continue
        got = trajectory(cls, options, x, [g * 2.0**k for g in grads], dtype, compute)
        if options.get("orthogonalizer") == "svd":  # LAPACK scales large inputs by a ratio: to its rounding
            svd_eps = torch.finfo(torch.float64 if compute == torch.float64 else torch.float32).eps
            bound = 0.02 * 64 * svd_eps + 2 * torch.finfo(dtype).eps * want[-1].abs().max().item()
            assert all((a - b).abs().max().item() <= bound for a, b in zip(got, want)), f"2^{k}"
            continue
        assert all(torch.equal(a, b) for a, b in zip(got, want)), f"2^{k}"
    # negative control: another gradient (one entry changed) is told apart
    other = [g.clone() for g in grads]
    other[0][1, 2] += 0.5
    assert not torch.equal(trajectory(cls, options, x, other, dtype, compute)[-1], want[-1])


def test_known_norms_beyond_fp32s_range_are_scaled_before_they_are_rounded():
    """The fused momentum launch's norms come in fp64: an fp32 matrix whose norm exceeds fp32's largest value
    (here 2^124 entries, norm ~2^131) normalises as the same matrix scaled into range."""
    x = torch.randn(2, 64, 256, generator=GEN)
    big = x * 2.0**124
    norms = torch.linalg.vector_norm(big.double(), dim=(-2, -1))
    assert not torch.isfinite(norms.float()).all()  # what fp32 norms would have been
    for compute in (torch.float32, torch.float16):
        want = gram.normalised(x, 1.01, 0.0, compute, norms * 2.0**-124)
        assert torch.isfinite(want).all() and want.any()
        assert torch.equal(gram.normalised(big, 1.01, 0.0, compute, norms), want)
        assert torch.equal(gram.normalised(big, 1.01, 0.0, compute), gram.normalised(x, 1.01, 0.0, compute))


def test_entry_limit_leaves_no_sum_of_squares_to_overflow():
    """A matrix of entries all at the limit has a finite norm and normaliser in every compute dtype; entries
    16 times the limit (or the dtype's largest value) would not (the limit is tight to a small factor)."""
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        for count in (2, 240, 1 << 14, 1 << 20):  # (torch's norm of one entry is its |x|: nothing squared)
            limit = entry_limit(count, dtype, 1.01)
            full = torch.full((1, count), limit, dtype=dtype)
            assert torch.isfinite(frobenius(full, 1) * 1.01 + 1e-7).all(), (dtype, count)
            over = torch.full((1, count), min(limit * 16, torch.finfo(dtype).max), dtype=dtype)
            assert not torch.isfinite(frobenius(over, 1) * 1.01 + 1e-7).all(), (dtype, count)


def test_dion2_selects_by_l1_norms_beyond_fp32s_range():
    """fp32 slices whose L1 norm exceeds fp32's largest value: before, every such norm was inf and the
    selection fell to the lowest indices; now the largest are taken."""
    m = torch.full((6, 20), 2.0**125)
    m[4] *= 1.5
    m[5] *= 1.25
    norms = slice_norms(m, reduced_dims(2, False, True))
    assert torch.isfinite(norms).all()
    assert torch.nonzero(top_k_mask(norms.reshape(1, -1), 0.3)[0]).flatten().tolist() == [4, 5]
    fp32_sums = m.abs().sum(dim=1).reshape(1, -1)  # negative control: what the fp32 sums selected
    assert torch.nonzero(top_k_mask(fp32_sums, 0.3)[0]).flatten().tolist() == [0, 1]
