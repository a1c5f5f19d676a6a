"""optimizers/norms.py: the Frobenius norm of the normaliser (and NorMuon's/Dion2's restore) stays accurate on
large CPU matrices, where torch's CPU norm kernel loses ~3e-4 (pytorch/pytorch#169237)."""

import math

import numpy as np
import pytest
import torch

from optimizers import norms
from optimizers.norms import (CASCADE_FROM, denominator, downscale, entry_limit, frobenius, largest_power_of_two,
                             norm_limit, scale_of, scaled_and_cast)
from optimizers.orthogonalize import orthogonalize


def test_the_norm_of_a_large_fp32_matrix_is_accurate_on_cpu():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2048, 4608, generator=g, dtype=torch.float64)
    exact = torch.linalg.vector_norm(x, dim=(-2, -1))
    ours = frobenius(x.float(), (-2, -1)).double()
    assert ((ours - exact).abs() / exact).max() < 1e-6
    # negative control: one fp32 accumulator over the whole count (numpy's cumsum is sequential), the kind of
    # sum torch's CPU kernel does per lane, is flagged (7e-3 off here; torch's own norm: 3.2e-4 in torch 2.13)
    squares = np.square(x.float().numpy()).reshape(2, -1)
    running = torch.from_numpy(np.sqrt(np.cumsum(squares, axis=1, dtype=np.float32)[:, -1])).double()
    assert ((running - exact).abs() / exact).max() > 1e-5


def test_small_norms_keep_torchs_bits():
    """Below CASCADE_FROM elements (every CI and nightly matrix, on which the tolerance coefficients were
    measured) the norm is torch's, bit for bit."""
    x = torch.randn(3, 96, 384, generator=torch.Generator().manual_seed(1))
    for dtype in (torch.float32, torch.bfloat16):
        y = x.to(dtype)
        assert torch.equal(frobenius(y, (-2, -1), keepdim=True), torch.linalg.matrix_norm(y, ord="fro", keepdim=True))
        assert torch.equal(frobenius(y.reshape(3, -1), 1), y.reshape(3, -1).norm(dim=1))


def test_frobenius_keeps_dtype_and_dims(monkeypatch):
    monkeypatch.setattr("optimizers.norms.CASCADE_FROM", 1)  # the cascade path, on small tensors
    x = torch.randn(3, 4, 5)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        y = frobenius(x.to(dtype), (-2, -1), keepdim=True)
        assert y.dtype == dtype and y.shape == (3, 1, 1)
        assert torch.allclose(y.double(), torch.linalg.vector_norm(x.to(dtype).double(), dim=(-2, -1), keepdim=True),
                              rtol=1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-6)
    assert frobenius(x, 1).shape == (3, 5)


def test_a_large_fp32_orthogonalization_on_cpu_is_not_moved_by_the_norm():
    """Polar Express in fp32 on a 1024 x 2304 Gaussian matrix: 8.7e-5 off the fp64 iteration with torch's CPU
    norm in the normaliser, 1.7e-6 with this one."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1024, 2304, generator=g, dtype=torch.float64)
    exact = orthogonalize(x, "polar_express", 5, 1e-7, torch.float64)
    for name in ("polar_express", "gram_newton_schulz"):
        got = orthogonalize(x.float(), name, 5, 1e-7, torch.float32).double()
        assert ((got - exact).norm() / exact.norm()).item() < 1e-5, name


def _always_scaled(x: torch.Tensor, limit: float, dtype: torch.dtype):
    """The largest-entry pass on every stack (what runs off CPU)."""
    scale = downscale(x, (-2, -1), limit)
    cast = torch.mul(x, scale, out=torch.empty_like(x, dtype=dtype))
    return cast, frobenius(cast, (-2, -1), keepdim=True), scale


@pytest.mark.parametrize("source, dtype", [(torch.float32, torch.float32), (torch.float32, torch.bfloat16),
                                           (torch.float32, torch.float16), (torch.float64, torch.float64),
                                           (torch.bfloat16, torch.float32)])
def test_the_cpu_shortcut_gives_the_scaled_paths_bits_and_skips_its_pass_only_where_nothing_is_scaled(
        source, dtype, monkeypatch):
    """scaled_and_cast on CPU: a stack whose norms bound every entry within the limit keeps the cast and its norm
    (no largest-entry pass); one matrix too large (or not finite) sends the whole stack through the pass; the
    quotient x / denominator is the always-scaled one, bit for bit, either way."""
    g = torch.Generator().manual_seed(2)
    base = torch.randn(4, 12, 20, generator=g, dtype=torch.float64)
    limit = entry_limit(12 * 20, dtype, 1.0)
    passes = []
    monkeypatch.setattr(norms, "downscale", lambda *a: passes.append(1) or downscale(*a))
    for name, edit, scaled in [("plain", lambda x: x, False),
                               ("at half the limit", lambda x: x / x.norm() * limit / 4, False),
                               # the pass runs (nothing is scaled: every entry within the limit, the norm past
                               # half of it); a shortcut that took it would be unproven there
                               ("past half the limit",
                                lambda x: x / x.norm(dim=(-2, -1), keepdim=True) * limit * 0.75, True),
                               ("one huge", lambda x: torch.cat([x[:3], x[3:] * limit]), True),
                               ("a NaN", lambda x: torch.cat([x[:3], x[3:] * math.nan]), True),
                               ("an inf", lambda x: torch.cat([x[:3], x[3:] * math.inf]), True)]:
        x = edit(base).to(source).mT.contiguous().mT  # the transposed view a tall stack arrives as
        passes.clear()
        got = norms.scaled_and_cast(x, (-2, -1), limit, dtype)
        want = _always_scaled(x, limit, dtype)
        assert bool(passes) == scaled, name
        quotient = [c / denominator(n, 1.0, 1e-7, s) for c, n, s in (got, want)]
        assert torch.equal(quotient[0].nan_to_num(7.0), quotient[1].nan_to_num(7.0)), name
        assert got[0].dtype == dtype and got[0].stride() == want[0].stride(), name


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("factor", [1.0, 1.01, 3.0])
def test_the_limits_are_the_largest_powers_of_two_their_contracts_allow(dtype, factor):
    """norm_limit: the largest power of two L with factor L within a quarter of the format's largest value;
    entry_limit: the largest power of two E such that `count` entries of E keep the norm within L and the sum of
    squares (in at least fp32) within a quarter of its format's largest value. Pinned from both sides (E holds,
    2E does not), so that a limit moved either way fails here: the quotient itself is the same bits under any
    power-of-two scale, so no case can see a limit that is too small, and only inputs at the format's edge one
    that is too large."""
    top = torch.finfo(dtype).max
    summed = torch.finfo(torch.promote_types(dtype, torch.float32)).max
    limit = norm_limit(dtype, factor)
    assert limit == 2.0 ** math.floor(math.log2(limit)) and factor * limit <= top / 4 < factor * 2 * limit
    for count in (1, 240, 36_864, 1 << 22):
        def holds(e: float) -> bool:
            return e * math.sqrt(count) <= limit and count * e * e <= summed / 4
        e = entry_limit(count, dtype, factor)
        assert e == 2.0 ** math.floor(math.log2(e)) and holds(e) and not holds(2 * e), (count, e)


@pytest.mark.parametrize("shape", [(2, 0, 3), (2, 3, 0), (0, 3, 4)])
def test_an_empty_matrix_is_scaled_by_one(shape):
    """`downscale` of matrices with no entry: 1 per matrix (the inf norm of an empty dim is an error, so the
    guard takes them first; its `< 0` mutant let them through)."""
    got = downscale(torch.empty(shape), (-2, -1), 1.0)
    assert got.shape == shape[:1] + (1, 1) and bool((got == 1).all())


def test_the_entry_limit_holds_where_the_sum_of_squares_meets_the_quarter_exactly():
    """4095 x 4097 = 2^24 - 1 fp32 entries of 2^51: their squares sum to exactly a quarter of fp32's largest
    value, which the limit allows (`<` for `<=` halved it)."""
    assert entry_limit(4095 * 4097, torch.float32, 1.0) == 2.0 ** 51
    assert 4095 * 4097 * 2.0 ** 102 == torch.finfo(torch.float32).max / 4


def test_a_largest_entry_at_the_limit_keeps_the_scale_one():
    """`scale_of`: 1 where the largest |entry| is at most the limit, the limit itself included."""
    top = torch.tensor([2.0 ** 20, 2.0 ** 20 + 1, 3.0])
    assert scale_of(top, 2.0 ** 20).tolist() == [1.0, 2.0 ** -21, 1.0]


def test_the_cpu_norm_is_the_cascade_sum_from_cascade_from_elements():
    """At exactly CASCADE_FROM elements (256 x 256) the CPU norm is the cascade sum's, whose bits differ from
    torch's norm kernel here (`<=` for `<` kept torch's)."""
    x = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    assert x.numel() == CASCADE_FROM
    cascade = x.square().sum().sqrt()
    assert torch.equal(frobenius(x, (-2, -1)), cascade) and not torch.equal(cascade, torch.linalg.vector_norm(x))


def test_off_the_cpu_the_norm_and_the_cast_are_torchs_device_forms(monkeypatch):
    """A tensor off the CPU (a meta tensor, as a step's rehearsal holds) takes torch's norm, whatever its count,
    and the overflow-safe cast's device form, which reads nothing on the host (the CPU form's check would)."""
    called = []
    original = torch.linalg.vector_norm
    monkeypatch.setattr(torch.linalg, "vector_norm", lambda *a, **k: called.append(1) or original(*a, **k))
    x = torch.empty(2, 256, 256, device="meta")
    assert frobenius(x, (-2, -1)).shape == (2,) and called
    cast, norm, scale = scaled_and_cast(x, (-2, -1), 1.0, torch.bfloat16)
    assert cast.device.type == "meta" and cast.dtype == torch.bfloat16 and scale.shape == (2, 1, 1)


def test_fp64_keeps_torchs_norm_at_any_count():
    """fp64 CPU norms are torch's (its fp64 accumulation is accurate), not the cascade sum, whose bits differ
    here (`and` for the first `or` of the test sent them to the cascade)."""
    x = torch.randn(256, 256, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    want = torch.linalg.vector_norm(x)
    assert torch.equal(frobenius(x, (-2, -1)), want) and not torch.equal(x.square().sum().sqrt(), want)


def test_the_entry_limit_of_more_entries_than_the_norm_limits_square_is_below_one():
    """fp16's norm limit is 2^13: 2^28 entries may each hold at most 2^13 / 2^14 = 0.5. The search starts
    from an estimate below norm / sqrt(count) (a difference or a floor division there is <= 0: no power of two)."""
    assert entry_limit(2 ** 28, torch.float16, 1.0) == 0.5


@pytest.mark.parametrize("estimate", [1.0, 1024.0, 2.0 ** 40, 3e12])
def test_the_largest_power_of_two_is_found_from_any_estimate(estimate):
    """From an estimate below the bound the search climbs, from one above it descends (the estimates of
    norm_limit and entry_limit sit near their bounds, so `p *= 1` in the climb passed every case)."""
    assert largest_power_of_two(lambda p: p <= 1500.0, estimate) == 1024.0


def test_the_norm_limit_leaves_exactly_a_quarter_of_the_range():
    """factor L <= max / 4: at a factor of 1.9, fp32's limit is still 2^125 (1.9 x 2^125 is below fp32's
    max / 4 = 1.99999988 x 2^125; a fifth, say, would halve it)."""
    assert norm_limit(torch.float32, 1.9) == 2.0 ** 125 and norm_limit(torch.float32, 2.0) == 2.0 ** 124
