"""Gram Newton–Schulz: equal to the standard iteration's exact spectral map, restarts, divergence fallback."""

import warnings

import numpy as np
import pytest
import torch

from optimizers.coefficients import normaliser_scale, schedule
from optimizers.counters import Stats, counting
from optimizers.gram_newton_schulz import gram_newton_schulz, gram_steps, normalised, standard_steps
from oracles import Orthogonalizer, spectral_map


def matrix(m, n, spectrum=None, seed=0):
    rng = np.random.default_rng(seed)
    if spectrum is None:
        return rng.standard_normal((m, n))
    k = min(m, n)
    u = np.linalg.qr(rng.standard_normal((m, k)))[0]
    v = np.linalg.qr(rng.standard_normal((n, k)))[0]
    return (u * spectrum(k)) @ v.T


SPECTRA = {"gaussian": None, "cond1e6": lambda k: np.logspace(0, -6, k),
           "near-zero": lambda k: np.r_[1.0, np.full(k - 1, 1e-3)],
           "rank-deficient": lambda k: np.r_[np.ones(k - k // 2), np.zeros(k // 2)]}


def gram(g, name, dtype=torch.float64, **kw):
    x = torch.from_numpy(g)[None]
    return gram_newton_schulz(x, schedule(name, 5), normaliser_scale(name), 1e-7, dtype, **kw)[0].numpy()


@pytest.mark.parametrize("name", ["polar_express", "newton_schulz"])
@pytest.mark.parametrize("spectrum", SPECTRA)
@pytest.mark.parametrize("shape", [(16, 16), (16, 32), (8, 128), (12, 192), (192, 12)])
def test_fp64_gram_equals_the_spectral_map(name, spectrum, shape):
    """Aspect ratios 1 to 16, condition up to 1e6, rank deficiency: in fp64 the published schedule
    agrees with the exact iteration to ~1e-12 (measured worst 1.8e-12, benchmarks/gram_ns_accuracy.py)."""
    g = matrix(*shape, SPECTRA[spectrum])
    spec = Orthogonalizer.named(name)
    ref = spectral_map(g, spec.schedule, spec.normaliser)
    assert np.linalg.norm(gram(g, name) - ref) <= 5e-12 * np.linalg.norm(ref)


@pytest.mark.parametrize("m", [12, 300])
def test_square_matrices_take_the_standard_iteration(m):
    """Also above 256 rows, where shapes are distinct int objects (an `is not` for the `!=` sent them to Gram)."""
    g = torch.from_numpy(matrix(m, m))[None]
    coefficients = schedule("polar_express", 5)
    direct = standard_steps(normalised(g, 1.01, 1e-7, torch.float64), coefficients)
    with counting(Stats()) as stats:
        assert torch.equal(gram_newton_schulz(g, coefficients, 1.01, 1e-7, torch.float64), direct)
    assert stats.gram == 0


def test_restarts_change_the_arithmetic_not_the_result():
    """In fp64 a restart before any step, 0 and past the schedule included, gives the same result: R is kept
    up to date between restarts (mutants that skipped its update at odd steps, or at steps whose index shifted
    or halved lies in `restarts`, were not)."""
    g = torch.from_numpy(matrix(8, 64, SPECTRA["cond1e6"]))[None]
    x = normalised(g, 1.0, 1e-7, torch.float64)
    coefficients = schedule("newton_schulz", 5)
    none, published, every = (gram_steps(x, coefficients, r) for r in ((), (2,), (1, 2, 3, 4)))
    assert not torch.equal(none, published)
    for restarts in ((), (2,), (0,), (1,), (3,), (1, 3), (0, 4), (5,), (9,)):
        torch.testing.assert_close(gram_steps(x, coefficients, restarts), every, rtol=0, atol=1e-11)
    direct = gram_newton_schulz(g, coefficients, 1.0, 1e-7, torch.float64, restarts=(0,))  # 0 is a valid index
    torch.testing.assert_close(direct, every, rtol=0, atol=1e-11)


def test_restarts_matter_in_half_precision():
    """fp16 on a rank-deficient spectrum: without restarts the Gram iteration is far off the exact map;
    the published restart before step 2 recovers most of it, restarts at 2 and 4 all of it
    (the loss found by benchmarks/gram_ns_accuracy.py)."""
    g = matrix(8, 128, SPECTRA["rank-deficient"], seed=3)
    spec = Orthogonalizer.named("newton_schulz")
    ref = spectral_map(g, spec.schedule, spec.normaliser)
    err = {r: np.linalg.norm(gram(g, "newton_schulz", torch.float16, restarts=r) - ref) / np.linalg.norm(ref)
           for r in ((), (2,), (2, 4))}
    assert err[()] > 0.2 and err[(2, 4)] < 0.1, err


def test_divergence_is_recomputed_by_the_standard_iteration_counted_and_warned_once():
    """bf16 (iterated in fp16, HALF_ITERATES) without restarts on an ill-conditioned wide matrix diverges
    (spurious negative Gram eigenvalues); the result is the standard iteration's in the requested bf16, the
    fallback is counted in the counting scope, and the scope's first fallback warns (its second does not)."""
    g = torch.from_numpy(matrix(16, 256, SPECTRA["cond1e6"], seed=1))[None].float()
    coefficients = schedule("polar_express", 5)
    with counting(Stats()) as stats:
        with pytest.warns(RuntimeWarning, match="diverged .* recomputed by the standard iteration"):
            out = gram_newton_schulz(g, coefficients, 1.01, 1e-7, torch.bfloat16, restarts=())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            gram_newton_schulz(g, coefficients, 1.01, 1e-7, torch.bfloat16, restarts=())
    standard = standard_steps(normalised(g, 1.01, 1e-7, torch.bfloat16), coefficients).float()
    assert stats.fallbacks == 2 and stats.gram == 2
    assert torch.equal(out, standard)


def test_a_result_diverged_above_twice_the_square_root_of_its_rows(monkeypatch):
    """The divergence bound is ||X||_F > 2 sqrt(m) (DIVERGED, documented): of two Gram results whose norms lie
    0.5% below and above it, only the second falls back to the standard iteration (mutants of the bound, its
    factor or its exponent moved it past one of them)."""
    from optimizers import gram_newton_schulz as gram
    m, n = 16, 32
    rows = torch.randn(2, m, n, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    crafted = rows / torch.linalg.vector_norm(rows, dim=(-2, -1), keepdim=True)
    crafted = crafted * torch.tensor([0.995, 1.005], dtype=torch.float64).view(2, 1, 1) * 2 * m ** 0.5
    monkeypatch.setattr(gram, "gram_steps", lambda *a, **k: crafted.clone())
    g = torch.randn(2, m, n, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with counting(Stats()) as stats, pytest.warns(RuntimeWarning, match="diverged"):
        out = gram_newton_schulz(g, schedule("polar_express", 5), 1.01, 1e-7, torch.float64)
    assert stats.gram == 2 and stats.fallbacks == 1
    assert torch.equal(out[0], crafted[0]) and not torch.equal(out[1], crafted[1])


def test_the_fallback_warning_names_the_call_that_fell_back():
    """The first fallback's warning is attributed to gram_newton_schulz's call of `fallback` (stacklevel 2), not
    to `fallback` itself nor to the orthogonalizer's caller."""
    import inspect
    from optimizers import gram_newton_schulz as gram
    source, first = inspect.getsourcelines(gram.gram_newton_schulz)
    line = first + next(i for i, text in enumerate(source) if text.strip().startswith("fallback("))
    g = torch.from_numpy(matrix(16, 256, SPECTRA["cond1e6"], seed=1))[None].float()
    with pytest.warns(RuntimeWarning, match="diverged") as caught:
        gram_newton_schulz(g, schedule("polar_express", 5), 1.01, 1e-7, torch.bfloat16, restarts=())
    assert (caught[0].filename, caught[0].lineno) == (gram.__file__, line)


def test_known_norms_of_a_matrix_near_overflow_are_scaled_with_it():
    """Norms given (in fp64) for a matrix whose norm overflows fp32 (entries +-2^122, 64 x 256: norm 2^129): the
    matrix and its norm are scaled by the same power of two, so the result is the one formed without them (a `/`
    or `**` for the `*` of the norm's scaling divided by another norm)."""
    from optimizers.norms import frobenius
    from optimizers.orthogonalize import orthogonalize
    signs = torch.where(torch.randn(1, 64, 256, generator=torch.Generator().manual_seed(0)) > 0, 1.0, -1.0)
    x = signs * 2.0 ** 122
    plain = orthogonalize(x, "gram_newton_schulz", 5, 1e-7, torch.float32)
    given = orthogonalize(x, "gram_newton_schulz", 5, 1e-7, torch.float32, norms=frobenius(x.double(), (-2, -1)))
    assert bool(plain.isfinite().all()) and plain.abs().max() > 0.1
    torch.testing.assert_close(given, plain, rtol=1e-5, atol=1e-6)


def test_deferred_checks_count_the_matrices_and_read_each_calls_flag():
    """Inside deferred_checks a call records one flag and its matrix count (from 0) instead of reading them;
    read_flags reads each checks' flag, False where none was recorded."""
    from optimizers import gram_newton_schulz as gram
    g = torch.randn(3, 8, 24, generator=torch.Generator().manual_seed(6))
    coefficients = schedule("polar_express", 5)
    with gram.deferred_checks() as honest:
        gram_newton_schulz(g, coefficients, 1.01, 1e-7, torch.float32)
    assert honest.matrices == 3 and len(honest.flags) == 1
    with gram.deferred_checks():  # the deferred return gives the dtype asked for too
        assert gram_newton_schulz(g, coefficients, 1.01, 1e-7, torch.bfloat16).dtype == torch.float32
        assert gram_newton_schulz(g, coefficients, 1.01, 1e-7, torch.bfloat16, out_dtype=torch.bfloat16).dtype \
            == torch.bfloat16
    with gram.deferred_checks() as empty:
        pass
    assert empty.matrices == 0 and not empty.flags
    diverged = gram.DeferredChecks([torch.tensor([False, True])], 2)
    assert gram.read_flags([honest, empty, diverged]) == [False, False, True]
    assert gram.read_flags([empty]) == [False]


def test_the_result_comes_in_the_dtype_asked_for():
    """out_dtype when given (a bf16 result of an fp32 stack, wide and tall), else the input's dtype; an empty
    matrix stack is no Gram matrix."""
    coefficients = schedule("polar_express", 5)
    for shape in ((2, 8, 24), (2, 24, 8)):
        g = torch.randn(shape, generator=torch.Generator().manual_seed(7))
        assert gram_newton_schulz(g, coefficients, 1.01, 1e-7, torch.bfloat16, out_dtype=torch.bfloat16).dtype \
            == torch.bfloat16
        assert gram_newton_schulz(g, coefficients, 1.01, 1e-7, torch.bfloat16).dtype == torch.float32
    with counting(Stats()) as stats:
        empty = gram_newton_schulz(torch.zeros(2, 0, 5), coefficients, 1.01, 1e-7, torch.float32)
    assert empty.shape == (2, 0, 5) and stats.gram == 0


@pytest.mark.parametrize("shape", [(8, 24), (1, 2, 8, 24)])
def test_anything_but_a_stack_of_matrices_is_refused(shape):
    with pytest.raises(ValueError, match=r"expected a stack of matrices \[B, m, n\]"):
        gram_newton_schulz(torch.ones(shape), schedule("polar_express", 5), 1.01, 1e-7, torch.float32)


def test_fp16_normalises_before_it_rounds():
    """A gradient of 1e10 overflows fp16 (max 65504) unless it is normalised first."""
    g = torch.from_numpy(matrix(8, 32) * 1e10)[None]
    out = gram_newton_schulz(g, schedule("polar_express", 5), 1.01, 1e-7, torch.float16)
    assert torch.isfinite(out).all() and out.abs().max() > 0.1


@pytest.mark.parametrize("restarts", [(-1,), (1.5,), (True,)])
def test_bad_restarts_are_rejected(restarts):
    with pytest.raises(ValueError, match="restarts"):
        gram_newton_schulz(torch.zeros(1, 2, 4), schedule("polar_express", 5), 1.0, 1e-7, torch.float32, restarts)


def test_muon_with_gram_newton_schulz_steps_as_the_standard_iteration_in_fp64():
    import optimizers

    gen = torch.Generator().manual_seed(0)
    shapes = [(16, 64)] * 3 + [(8, 4, 3, 3), (40, 6)]
    gram_params = [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64)) for s in shapes]
    plain = [torch.nn.Parameter(p.detach().clone()) for p in gram_params]
    for p, q in zip(gram_params, plain):
        p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        q.grad = p.grad.clone()
    counted = []
    for coefficients in ("polar_express", "newton_schulz"):
        opt = optimizers.Muon(gram_params, orthogonalizer="gram_newton_schulz", ns_coefficients=coefficients,
                              compute_dtype=torch.float64, flatten=True)
        opt.step()
        counted.append(opt.stats.gram)
        plain_opt = optimizers.Muon(plain, orthogonalizer=coefficients, compute_dtype=torch.float64, flatten=True)
        plain_opt.step()
        assert plain_opt.stats.gram == 0
        for p, q in zip(gram_params, plain):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-13)
    assert counted == [5, 5]  # three 16x64 members, a flattened 8x36 conv, a 40x6 matrix, each optimizer's own


@pytest.mark.parametrize("options,match", [
    (dict(orthogonalizer="gram_newton_schulz", ns_coefficients="chebyshev"), "ns_coefficients"),
    (dict(orthogonalizer="polar_express", ns_coefficients="newton_schulz"), "ns_coefficients"),
    (dict(orthogonalizer="gram_newton_schulz", gram_restarts=(2, -1)), "gram_restarts"),
    (dict(orthogonalizer="gram_newton_schulz", gram_restarts=2), "gram_restarts"),
])
def test_gram_options_are_checked_at_construction(options, match):
    import optimizers

    with pytest.raises(ValueError, match=match):
        optimizers.Muon([torch.nn.Parameter(torch.zeros(4, 8))], **options)


def _low_rank_momentum(rng, m, n):
    """Two low-rank gradients (the harness's "lowrank": min(m, n) // 8 singular values 1, the rest 1e-2)
    summed as momentum 0.95 sums them."""
    def low():
        k = min(m, n)
        u, v = np.linalg.qr(rng.standard_normal((m, k)))[0], np.linalg.qr(rng.standard_normal((n, k)))[0]
        return (u * np.where(np.arange(k) < max(1, k // 8), 1.0, 1e-2)) @ v.T
    return 0.95 * low() + low()


def _along_singular_pairs(g, out, ref):
    """out's and ref's values along g's singular pairs p^T X q, over the pairs whose mapped value is resolved
    (at least a tenth of the largest)."""
    p, _, qt = np.linalg.svd(g, full_matrices=False)
    got, want = (np.einsum("ij,ik,jk->j", p, x, qt) for x in (out, ref))
    keep = want > 0.1 * want.max()
    return got[keep], want[keep]


def test_bf16_gram_keeps_the_largest_singular_value_of_a_low_rank_momentum():
    """The bf16 noise finding: on the momentum of `muon/conv1d-8x4x5/mb1/noflat/fp32@bf16/gns/none/plain/
    wd0.1/steps3/lowrank/seed1` (step 2, matrix 5), Gram NS iterated in bf16 returned -0.20 along the largest
    singular value where the map gives 0.94, with ||X||_F = 1.5 sqrt(m), inside the divergence test. bf16
    is iterated in fp16 as the published versions do (HALF_ITERATES): 0.91."""
    from cases import Case
    from cases.data import gradient

    case = Case.from_id("muon/conv1d-8x4x5/mb1/noflat/fp32@bf16/gns/none/plain/wd0.1/steps3/lowrank/seed1")
    u = case.momentum * gradient(case, 0, 0) + gradient(case, 0, 1)
    g = u[5]
    spec = Orthogonalizer.named("polar_express")
    got, want = _along_singular_pairs(g, gram(g.astype(np.float32), "polar_express", torch.bfloat16).astype(
        np.float64), spectral_map(g, spec.schedule, spec.normaliser))
    assert want[0] == pytest.approx(0.936, abs=1e-3)
    assert np.max(np.abs(got - want)) < 0.1, (got, want)


@pytest.mark.parametrize("m, n", [(4, 5), (8, 12)])
def test_bf16_gram_is_as_accurate_as_fp16_on_low_rank_momenta(m, n):
    """Over 50 low-rank momenta, the worst error of a resolved singular value of bf16 Gram NS: iterated in bf16
    it was 1.78 (4 x 5) and 1.26 (8 x 12) over 200, the standard bf16 iteration 0.50 and 0.15; in fp16 0.09
    and 0.07."""
    rng = np.random.default_rng(0)
    spec = Orthogonalizer.named("polar_express")
    worst = 0.0
    for _ in range(50):
        g = _low_rank_momentum(rng, m, n)
        out = gram(g.astype(np.float32), "polar_express", torch.bfloat16).astype(np.float64)
        got, want = _along_singular_pairs(g, out, spectral_map(g, spec.schedule, spec.normaliser))
        worst = max(worst, float(np.max(np.abs(got - want))))
    assert worst < 0.2


@pytest.mark.parametrize("shape", [(3, 8, 24), (3, 24, 8), (3, 8, 8)])
def test_known_norms_are_divided_by_and_refused_where_they_do_not_belong(shape, monkeypatch):
    """`orthogonalize(..., norms=)`: Gram Newton–Schulz divides by the norms given (wide, tall and square,
    also in a divergence's fallback: DIVERGED at 0 sends every Gram result there): given the ones it would
    form, its bits (also in fp64, as the fused momentum launch gives them); given others, another result.
    Norms for another orthogonalizer, or of the wrong shape or dtype, are refused before any work."""
    from optimizers import gram_newton_schulz as gram
    from optimizers.orthogonalize import orthogonalize
    from optimizers.norms import frobenius
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    own = frobenius(x, (-2, -1))
    for diverged in (gram.DIVERGED, 0.0):
        monkeypatch.setattr(gram, "DIVERGED", diverged)
        plain = orthogonalize(x, "gram_newton_schulz", 5, 1e-7, torch.float16)
        given = orthogonalize(x, "gram_newton_schulz", 5, 1e-7, torch.float16, norms=own.clone())
        doubled = orthogonalize(x, "gram_newton_schulz", 5, 1e-7, torch.float16, norms=own * 2)
        assert torch.equal(plain, given) and not torch.allclose(plain, doubled, atol=1e-3)
    assert torch.equal(plain, orthogonalize(x, "gram_newton_schulz", 5, 1e-7, torch.float16, norms=own.double()))
    for name, norms in (("polar_express", own), ("gram_newton_schulz", own[:2]),
                        ("gram_newton_schulz", own.half())):
        with pytest.raises(ValueError, match="norms"):
            orthogonalize(x, name, 5, 1e-7, torch.float16, norms=norms)
