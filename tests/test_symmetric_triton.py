"""The Triton symmetric product (optimizers/symmetric_triton.py): skipped without triton; on CPU it runs
under Triton's interpreter (TRITON_INTERPRET=1) in fp16 (the interpreter's bf16 tl.dot is wrong: a
16 x 16 product came out 2e10 off), on CUDA in bf16 and fp16 at sizes that engage it."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # before triton's import, which reads it (this process has no GPU to leak to)
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")


@pytest.fixture(scope="module")
def kernel():
    from optimizers import symmetric_triton
    return symmetric_triton


def device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def tiles(kernel):
    """Small tiles under the interpreter (seconds), the GPU's own on CUDA."""
    return dict(tile=16, tile_k=16) if kernel.interpreted() else {}


def stack(*shape, seed=0, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device(), dtype=dtype)


def dtypes():
    return [torch.float16, torch.bfloat16] if torch.cuda.is_available() else [torch.float16]


def assert_one_rounding(got, exact, dtype):
    """Within 2 units of `dtype`'s rounding of the fp32-accumulated result (of its largest entry)."""
    bound = 2 * torch.finfo(dtype).eps * exact.abs().max()
    assert (got.float() - exact).abs().max() <= bound, float((got.float() - exact).abs().max() / bound)


def computed(m, tile):
    """The entries the kernel computes (tiles on and above the diagonal); the rest are their mirror."""
    t = torch.arange(m, device=device()) // tile
    return t[:, None] <= t[None, :]


def assert_mirrored(got, tile):
    """Every tile above the diagonal is the exact transpose of its mirror below."""
    m = got.size(-1)
    for lo in range(0, m, tile):
        hi = min(lo + tile, m)
        assert torch.equal(got[:, lo:hi, hi:], got[:, hi:, lo:hi].mT)


@pytest.mark.parametrize("b, m, k", [(2, 40, 70), (1, 48, 16), (3, 33, 47)])
def test_gram_matrix_by_upper_tiles(kernel, b, m, k):
    """X Xᵀ with m and k not multiples of the tiles (masked edges), transposed operand as a view."""
    for dtype in dtypes():
        x = stack(b, m, k, dtype=dtype) if kernel.interpreted() else stack(b, 8 * m, 64 * k, dtype=dtype)
        got = kernel.symmetric_baddbmm(None, x, x.mT, **tiles(kernel))
        assert_one_rounding(got, x.float() @ x.float().mT, dtype)
        assert_mirrored(got, tiles(kernel).get("tile", kernel.TILE))


def test_polynomial_products_with_input(kernel):
    """beta R + alpha R R and a product of two commuting symmetric matrices (R and bR + cR²)."""
    for dtype in dtypes():
        x = stack(2, 40, 64, seed=1, dtype=dtype) if kernel.interpreted() else stack(2, 2048, 4096, seed=1, dtype=dtype)
        # spectral norm about 1, as Gram NS's iterates have: a Gaussian m x k has ||x||_2 ~ sqrt(m) + sqrt(k).
        # (Frobenius-normalised at 2048 x 4096, R R held fp16 subnormals, spacing 6e-8 above the bound.)
        x = x / (x.size(-2) ** 0.5 + x.size(-1) ** 0.5)
        r = (x.float() @ x.float().mT).to(dtype)
        got = kernel.symmetric_baddbmm(r, r, r, -4.775, 2.0315, **tiles(kernel))
        exact = -4.775 * r.float() + 2.0315 * (r.float() @ r.float())
        assert_one_rounding(got, exact, dtype)
        z = exact.to(dtype)  # R Z is symmetric only up to the rounding of Z: compare the computed tiles
        got = kernel.symmetric_baddbmm(None, r, z, **tiles(kernel))
        mask = computed(r.size(-1), tiles(kernel).get("tile", kernel.TILE))
        assert_one_rounding(got[:, mask], (r.float() @ z.float())[:, mask], dtype)


def test_a_nonsymmetric_product_is_detected(kernel):
    """Negative control: the mirror assumes symmetry, so an asymmetric product comes out wrong."""
    a, b = stack(1, 40, 24, seed=2), stack(1, 24, 40, seed=3)
    if not kernel.interpreted():
        a, b = stack(1, 512, 256, seed=2), stack(1, 256, 512, seed=3)
    got = kernel.symmetric_baddbmm(None, a, b, **tiles(kernel))
    assert (got.float() - a.float() @ b.float()).abs().max() > 1.0


def test_bad_operands_are_refused_before_any_launch(kernel):
    x = stack(1, 32, 16)
    with pytest.raises(ValueError, match="takes"):
        kernel.symmetric_baddbmm(None, x.float(), x.float().mT)
    with pytest.raises(ValueError, match="square products"):
        kernel.symmetric_baddbmm(None, x, x)


def test_the_blocked_products_take_the_kernel_when_asked(kernel, monkeypatch):
    """symmetric.TRITON routes a product that would be split into blocks to the kernel (counted), and
    the Gram Newton-Schulz iteration through it stays within the plain products' error."""
    from optimizers import symmetric
    from optimizers.coefficients import normaliser_scale, schedule
    from optimizers.gram_newton_schulz import gram_newton_schulz

    monkeypatch.setattr(symmetric, "_KERNEL", [kernel])
    if kernel.interpreted():
        monkeypatch.setattr(symmetric, "BLOCK", 16)
        monkeypatch.setattr(kernel, "TILE", 16)
        monkeypatch.setattr(kernel, "TILE_K", 16)
        x = stack(1, 32, 96, seed=4).double()
    else:
        x = stack(1, 2048, 6144, seed=4).double()
    coefficients = schedule("polar_express", 5)

    def run(compute):
        return gram_newton_schulz(x, coefficients, normaliser_scale("polar_express"), 1e-7, compute).double()

    exact, plain = run(torch.float64), run(torch.float16)
    before = kernel.STATS.products
    monkeypatch.setattr(symmetric, "TRITON", True)
    fast = run(torch.float16)
    assert kernel.STATS.products > before
    assert (fast - exact).norm() <= 1.5 * (plain - exact).norm(), ((fast - exact).norm(), (plain - exact).norm())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (a 4 GiB stack)")
def test_a_batch_offset_past_int32_is_addressed_in_int64(kernel):
    """The second matrix of this stack starts 2^31 elements in (as the 48th of 4096 x 11008 bf16 does):
    int32 batch offsets wrapped and faulted (an illegal memory access on an H200, 72 x 4096 x 11008)."""
    buffer = torch.zeros(2**31 + 256 * 128, dtype=torch.bfloat16, device="cuda")
    a = buffer.as_strided((2, 256, 128), (2**31, 128, 1))
    a.copy_(stack(2, 256, 128, seed=7, dtype=torch.bfloat16))
    exact = torch.bmm(a.float(), a.float().mT)
    assert_one_rounding(kernel.symmetric_baddbmm(None, a, a.mT), exact, torch.bfloat16)


def test_a_matrix_past_int32_offsets_is_not_usable(kernel):
    """Offsets within one matrix stay int32: a matrix spanning 2^31 elements, or a product with 2^31
    entries, takes the torch path."""
    assert kernel.int32_offsets((72, 4096, 11008), (4096 * 11008, 11008, 1))
    assert not kernel.int32_offsets((1, 2, 16), (0, 2**31, 1))
    assert not kernel.int32_offsets((1, 46341, 16), (0, 16, 1))
    assert kernel.usable(stack(1, 32, 16)) and not kernel.usable(stack(1, 32, 16).float())
