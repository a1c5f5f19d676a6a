"""Symmetric products by their lower block triangle (optimizers/symmetric.py): equal to the full
product, and the iterations that use them unchanged by the split."""

import pytest
import torch

from optimizers import symmetric
from optimizers.coefficients import normaliser_scale, schedule
from optimizers.gram_newton_schulz import gram_newton_schulz, standard_steps
from optimizers.kernels import TORCH, Kernels


def wide(b=3, m=10, n=17, seed=0, dtype=torch.float64):
    return torch.randn(b, m, n, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("m, block, count", [(10, 4, 2), (13, 4, 3), (40, 4, 4), (7, 4, 1), (2047, 1024, 1),
                                             (2048, 1024, 2), (4096, 1024, 4), (16384, 1024, 4)])
def test_block_count(m, block, count):
    assert symmetric.blocks(m, block) == count


@pytest.mark.parametrize("m", [10, 13, 40])
def test_blocked_products_equal_the_full_ones(m):
    """Lower triangle: the same dot products as the full product; upper triangle: its mirror."""
    x = wide(m=m, n=23)
    gram = x @ x.mT
    got = symmetric.symmetric_bmm(x, x.mT, block=4)
    torch.testing.assert_close(got, gram, rtol=1e-13, atol=1e-13)
    k = symmetric.blocks(m, 4)
    edges = [i * m // k for i in range(k + 1)]
    for lo, hi in zip(edges, edges[1:-1]):  # above the diagonal blocks: the exact mirror
        assert torch.equal(got[:, lo:hi, hi:], got[:, hi:, lo:hi].mT)
    poly = torch.baddbmm(gram, gram, gram, beta=-4.775, alpha=2.0315)
    torch.testing.assert_close(symmetric.symmetric_baddbmm(gram, gram, gram, beta=-4.775, alpha=2.0315, block=4),
                               poly, rtol=1e-12, atol=1e-12)


def test_a_nonsymmetric_product_is_detected():
    """Negative control: the mirror assumes symmetry, so an asymmetric product comes out wrong."""
    a, b = wide(m=12, n=5), wide(m=5, n=12, seed=1)
    assert not torch.allclose(symmetric.symmetric_bmm(a, b, block=4), a @ b)


def test_small_matrices_take_one_plain_product():
    x = wide(m=12, n=30, dtype=torch.float32)
    assert torch.equal(symmetric.symmetric_bmm(x, x.mT), x @ x.mT)


@pytest.mark.parametrize("shape", [(24, 24), (24, 96)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_iterations_with_blocked_products_match_the_plain_ones(monkeypatch, shape, dtype):
    """Standard (square) and Gram (wide) Newton-Schulz with 8-row blocks: in fp64 equal to one plain
    product per step to 1e-12; in fp32 no farther from the fp64 result than the plain products are
    (within a factor 2: both are one rounding of the same map)."""
    x = wide(2, *shape, seed=2, dtype=dtype)
    coefficients = schedule("polar_express", 5)

    def run(compute):
        return gram_newton_schulz(x, coefficients, normaliser_scale("polar_express"), 1e-7, compute).double()

    exact, plain = run(torch.float64), run(dtype)
    counts, count = [], symmetric.blocks
    monkeypatch.setattr(symmetric, "BLOCK", 8)
    monkeypatch.setattr(symmetric, "blocks", lambda m, block: counts.append(count(m, block)) or counts[-1])
    blocked = run(dtype)
    assert counts and min(counts) == 3  # every symmetric product split (24 rows, 8-row blocks)
    if dtype == torch.float64:
        torch.testing.assert_close(blocked, plain, rtol=1e-12, atol=1e-12)
    else:
        assert (blocked - exact).norm() <= 2 * (plain - exact).norm()


def test_a_missing_mirror_is_caught_by_the_iteration_check(monkeypatch):
    """Negative control of the check above: blocks whose upper triangle is left at zero take the fp32
    iteration far from the fp64 one, far beyond twice the plain products' error."""
    x = wide(2, 24, 96, seed=2, dtype=torch.float32)
    coefficients = schedule("polar_express", 5)

    def run(compute):
        return gram_newton_schulz(x, coefficients, normaliser_scale("polar_express"), 1e-7, compute).double()

    exact, plain = run(torch.float64), run(torch.float32)
    full = symmetric._lower_blocks

    def unmirrored(input, a, b, beta, alpha, block, kernels):
        out = full(input, a, b, beta, alpha, block, kernels)
        return out.tril() if out.size(-1) > 16 else out

    monkeypatch.setattr(symmetric, "BLOCK", 8)
    monkeypatch.setattr(symmetric, "_lower_blocks", unmirrored)
    assert (run(torch.float32) - exact).norm() > 2 * (plain - exact).norm()


@pytest.mark.parametrize("kernels", [TORCH, Kernels(on=True), Kernels(on=True, sized=False)])
def test_without_the_kernel_a_polynomial_step_is_ax_plus_bx_and_w_is_refused(kernels):
    """Off the Triton kernel (no kernels allowed; or fp32, which it never takes), (aI + bA + cA²)X is
    aX + (bA + cA²)X as one baddbmm, the bits of the published form, and asking for W = aI + bA + cA² in one
    rounding is refused: only the kernel forms it."""
    x = wide(m=10, n=17, dtype=torch.float32)
    gram = symmetric.symmetric_bmm(x, x.mT, kernels=kernels)
    assert not symmetric.adds_identity(gram, kernels)
    poly = torch.baddbmm(gram, gram, gram, beta=-4.775, alpha=2.0315)
    assert torch.equal(symmetric.polynomial_product(gram, x, 3.4445, -4.775, 2.0315, kernels),
                       torch.baddbmm(x, poly, x, beta=3.4445))
    with pytest.raises(ValueError, match="Triton kernel only"):
        symmetric.polynomial_with_identity(gram, 3.4445, -4.775, 2.0315, kernels)


def test_symmetric_baddbmm_defaults_as_torch_baddbmm_and_takes_its_scalars_by_keyword():
    """beta and alpha default to 1 as torch.baddbmm's do, and are keyword-only (a positional beta is refused)."""
    from optimizers.symmetric import symmetric_baddbmm
    g = torch.Generator().manual_seed(9)
    a = torch.randn(2, 6, 5, generator=g, dtype=torch.float64)
    c = torch.randn(2, 6, 6, generator=g, dtype=torch.float64)
    c = c + c.mT
    torch.testing.assert_close(symmetric_baddbmm(c, a, a.mT), torch.baddbmm(c, a, a.mT), rtol=0, atol=1e-12)
    with pytest.raises(TypeError):
        symmetric_baddbmm(c, a, a.mT, 2.0)
