"""optimizers/orthogonalize.py: its refusals and the entry count its overflow limit is taken for (found by
mutation runs: each mutant here passed every case and test that reached its line)."""

from __future__ import annotations

import pytest
import torch

from optimizers import gram_newton_schulz as gram
from optimizers.orthogonalize import orthogonalize


@pytest.mark.parametrize("shape", [(64, 256), (1, 2, 64, 256)])
def test_anything_but_a_stack_of_matrices_is_refused_naming_its_shape(shape):
    """`x.ndim != 3` (its `< 3` and `> 3` mutants let a 4-D or a 2-D input through)."""
    with pytest.raises(ValueError, match=r"expected a stack of matrices \[B, m, n\], got shape"):
        orthogonalize(torch.ones(shape), "polar_express", 5, 1e-7, torch.float32)


@pytest.mark.parametrize("count", [2, 4])
def test_norms_of_another_count_are_refused(count):
    """One norm per matrix: more or fewer are refused (a `<` for the `!=` of the shapes let more through)."""
    with pytest.raises(ValueError, match="one per matrix"):
        orthogonalize(torch.ones(3, 8, 16), "gram_newton_schulz", 5, 1e-7, torch.float32, norms=torch.ones(count))


@pytest.mark.parametrize("shape", [(64, 256), (16, 1024)])
@pytest.mark.parametrize("name", ["polar_express", "newton_schulz", "gram_newton_schulz"])
def test_entries_whose_squares_overflow_only_summed_over_the_whole_matrix_are_scaled(name, shape):
    """A 64 x 256 fp32 matrix of entries +-2^58: each entry and each row's squares are far from fp32's range,
    but the sum of all 16,384 squares, 2^130, overflows it. The overflow limit is taken for the matrix's entry
    count (m n: 2^55 here); a count of m + n (2^58) or fewer left the matrix unscaled and the update 0. The
    result is the unscaled matrix's (orthogonalization ignores scale; the scaling is a power of two). Gram
    Newton-Schulz takes its own limit (gram_newton_schulz.normalised), for the same count. At 16 x 1024 a count of
    m m (256, whose limit is 2^59) leaves it unscaled too; at 64 x 256 the quarters' headroom hides that one."""
    signs = torch.where(torch.randn(1, *shape, generator=torch.Generator().manual_seed(0)) > 0, 1.0, -1.0)
    want = orthogonalize(signs, name, 5, 1e-7, torch.float32)
    got = orthogonalize(signs * 2.0 ** 58, name, 5, 1e-7, torch.float32)
    assert bool(got.isfinite().all()) and got.abs().max() > want.abs().max() / 2  # not the update of 0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, runs_on, transposed", [((2, 40, 24), (2, 24, 40), True),
                                                        ((2, 24, 40), (2, 24, 40), False),
                                                        ((2, 24, 24), (2, 24, 24), False)])
def test_a_tall_stack_is_orthogonalized_as_its_transpose(shape, runs_on, transposed, monkeypatch):
    """The iteration runs on the short side's Gram: a tall stack's transpose (a transposed view, its rows
    strided), a wide or square stack as it is (the orientation test's mutants moved it to the long side or never
    transposed; `>=` for `>` transposed square stacks, which only the strides show)."""
    seen = []
    original = gram.standard_steps

    def spy(x, *args, **kwargs):
        seen.append((tuple(x.shape), x.stride(-1) != 1))
        return original(x, *args, **kwargs)
    monkeypatch.setattr(gram, "standard_steps", spy)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    got = orthogonalize(x, "polar_express", 5, 1e-7, torch.float32)
    assert seen == [(runs_on, transposed)] and got.shape == x.shape


@pytest.mark.parametrize("name", ["svd", "gram_newton_schulz"])
def test_a_name_built_at_run_time_takes_its_orthogonalizer(name):
    """A name read from a config is equal to, not the same object as, the literal: `is` in place of `==`
    dispatched it to the wrong orthogonalizer (or refused Gram NS's known norms)."""
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    built = "".join(list(name))
    assert built == name and built is not name
    norms = torch.linalg.matrix_norm(x) if name == "gram_newton_schulz" else None
    got = orthogonalize(x, built, 5, 1e-7, torch.float64, norms=norms)
    assert torch.equal(got, orthogonalize(x, name, 5, 1e-7, torch.float64, norms=norms))
    assert not torch.equal(got, orthogonalize(x, "polar_express", 5, 1e-7, torch.float64))


@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 7, 3)])
def test_the_overflow_limits_are_taken_for_the_entry_count(shape, monkeypatch):
    """The polynomials' cast limit is `entry_limit` of the m n entries, the SVD's norm limit `norm_limit` of their
    root, wide or tall (the mutants took n n, m m, the batch size, sums and shifts of the dims; each leaves a
    matrix unscaled whose squares overflow, or scales one that needs none)."""
    from optimizers import orthogonalize as module
    counts, factors = [], []
    entry, norm = module.entry_limit, module.norm_limit
    monkeypatch.setattr(module, "entry_limit", lambda count, *a: counts.append(count) or entry(count, *a))
    monkeypatch.setattr(module, "norm_limit", lambda dtype, factor: factors.append(factor) or norm(dtype, factor))
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    orthogonalize(x, "polar_express", 5, 1e-7, torch.float32)
    orthogonalize(x, "svd", 5, 1e-7, torch.float32)
    assert counts == [21] and factors == [21 ** 0.5]


def test_the_svd_keeps_the_singular_values_above_the_long_side_times_eps_times_the_largest():
    """The cutoff is max(m, n) eps s_max, of the matrix's own dims: a stack of 200 tall 64 x 3 matrices in fp64
    with singular values (1, 0.5, t). At t = 30 eps the third direction is dropped (the short side's 3 eps would
    keep it), at t = 130 eps it is kept (the batch size's 200 eps, or all three dims', would drop it). The
    margins, 27 eps and more, are far above the rounding of the constructed matrices (a few eps)."""
    eps = torch.finfo(torch.float64).eps
    g = torch.Generator().manual_seed(4)
    u = torch.linalg.qr(torch.randn(200, 64, 3, generator=g, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(200, 3, 3, generator=g, dtype=torch.float64)).Q
    t = torch.tensor([30 * eps, 130 * eps], dtype=torch.float64).repeat(100)
    s = torch.stack([torch.ones_like(t), torch.full_like(t, 0.5), t], dim=-1)
    x = (u * s.unsqueeze(-2)) @ v.mT
    kept = orthogonalize(x, "svd", 5, 1e-7, torch.float64).square().sum((-2, -1))  # the rank of U V^T
    torch.testing.assert_close(kept, torch.tensor([2.0, 3.0], dtype=torch.float64).repeat(100))


@pytest.mark.parametrize("name", ["newton_schulz", "polar_express", "gram_newton_schulz", "svd"])
def test_the_result_is_in_out_dtype_by_default_the_stacks(name):
    """orth(x) comes back in x's dtype (a bf16 stack computed in fp32 is rounded back), or in `out_dtype` where
    one is named (the direct apply's bf16: the same values as the default's, uncast)."""
    x = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(0))
    plain = orthogonalize(x, name, 5, 1e-7, torch.bfloat16)
    direct = orthogonalize(x, name, 5, 1e-7, torch.bfloat16, out_dtype=torch.bfloat16)
    assert plain.dtype == torch.float32 and direct.dtype == torch.bfloat16
    assert torch.equal(direct, plain.to(torch.bfloat16))
    assert orthogonalize(x.bfloat16(), name, 5, 1e-7, torch.float32).dtype == torch.bfloat16
