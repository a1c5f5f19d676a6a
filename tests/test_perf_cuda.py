"""The fast paths on CUDA at sizes that engage them (skipped without CUDA): symmetric products by
blocks (from 2048 rows) and Gram Newton-Schulz, in bf16/fp16, no farther from the fp64 iteration
than the plain products are."""

import pytest
import torch

from optimizers import symmetric
from optimizers.orthogonalize import orthogonalize

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def gaussian(*shape, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float64)


def plain(fn):
    saved, symmetric.BLOCK = symmetric.BLOCK, 1 << 62
    try:
        return fn()
    finally:
        symmetric.BLOCK = saved


def rel(x, ref):
    return float((x.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("m, n", [(2048, 4096), (4096, 4096)])
def test_blocked_gram_matrix_in_bf16(m, n):
    x = gaussian(1, m, n).bfloat16()
    exact = x.double() @ x.double().mT
    assert symmetric.blocks(m) >= 2
    blocked, full = symmetric.symmetric_bmm(x, x.mT), x @ x.mT
    assert rel(blocked, exact) <= 1.5 * rel(full, exact)


@pytest.mark.parametrize("name, compute, shape", [
    ("polar_express", torch.bfloat16, (4096, 4096)),
    ("newton_schulz", torch.bfloat16, (2048, 6144)),
    ("gram_newton_schulz", torch.bfloat16, (2048, 6144)),
    ("gram_newton_schulz", torch.float16, (4096, 11008)),
])
def test_fast_orthogonalizers_match_the_plain_ones(name, compute, shape):
    """Each orthogonalizer with symmetric products by blocks: error against the same iteration in fp64 with
    plain products at most 1.5 times that of the same compute dtype with plain products."""
    g = gaussian(1, *shape, seed=1)
    exact = plain(lambda: orthogonalize(g, name, 5, 1e-7, torch.float64))
    fast = orthogonalize(g.float(), name, 5, 1e-7, compute)
    slow = plain(lambda: orthogonalize(g.float(), name, 5, 1e-7, compute))
    assert rel(fast, exact) <= 1.5 * rel(slow, exact), (rel(fast, exact), rel(slow, exact))
    assert rel(fast, exact) < 0.1
