"""The FP64 oracles against first principles, each with a negative control it must flag."""

import numpy as np
import pytest
import torch

from oracles import (KELLER_JORDAN_QUINTIC, Conventions, MuonHyper, Normaliser, Orthogonalizer, compose,
                     newton_schulz_schedule, polar_express_schedule, polar_factor, reference_muon_step,
                     round_to, singular_values, spectral_map, ulp)

RNG = np.random.default_rng(1234)


def explicit_iteration(g, schedule, normaliser):
    """The matrix iteration itself, in FP64: X <- aX + b(XX^T)X + c(XX^T)^2 X."""
    x = g / normaliser.denominator(np.linalg.norm(g))
    for a, b, c in schedule:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("shape", [(8, 36), (36, 8), (12, 12), (1, 16)])
@pytest.mark.parametrize("name", ["newton_schulz", "polar_express"])
def test_spectral_map_equals_the_explicit_iteration(shape, name):
    g = RNG.standard_normal(shape)
    spec = Orthogonalizer.named(name)
    expect = explicit_iteration(g, spec.schedule, spec.normaliser)
    assert rel(spectral_map(g, spec.schedule, spec.normaliser), expect) < 1e-13


def test_spectral_map_flags_a_wrong_coefficient():
    """Negative control: a typo in one coefficient moves the result far beyond fp64 agreement."""
    g = RNG.standard_normal((8, 36))
    spec = Orthogonalizer.named("newton_schulz")
    wrong = [(3.4445, -4.7705, 2.0315)] * 5
    assert rel(spectral_map(g, spec.schedule, spec.normaliser),
               explicit_iteration(g, wrong, spec.normaliser)) > 1e-4


def test_keller_jordan_quintic_does_not_converge_to_the_polar_factor():
    """docs/design.md §2: after 5 steps, [0.02, 1] lands in about [0.68, 1.13]."""
    out = compose(newton_schulz_schedule(5), np.linspace(0.02, 1.0, 20001))
    assert 0.67 < out.min() < 0.69 and 1.12 < out.max() < 1.14


def test_polar_express_converges_towards_one():
    out = compose(polar_express_schedule(8), np.linspace(1e-3, 1.0, 5001))
    assert np.all(np.abs(out - 1.0) < 0.2)


@pytest.mark.parametrize("shape", [(8, 36), (36, 8), (10, 10)])
def test_polar_factor_is_the_nearest_orthogonal_matrix(shape):
    g = RNG.standard_normal(shape)
    q = polar_factor(g, 1e-12)
    k = min(shape)
    np.testing.assert_allclose(singular_values(q), np.ones(k), atol=1e-13)
    h = q.T @ g if shape[0] >= shape[1] else g @ q.T  # symmetric positive semidefinite factor
    np.testing.assert_allclose(h, h.T, atol=1e-12)
    assert np.linalg.eigvalsh(h).min() > -1e-12


def test_polar_factor_flags_a_five_step_quintic():
    """Negative control: Keller Jordan's 5-step quintic is ~0.1+ away from U V^T elementwise."""
    g = RNG.standard_normal((8, 36))
    spec = Orthogonalizer.named("newton_schulz")
    assert np.abs(spectral_map(g, spec.schedule, spec.normaliser) - polar_factor(g, 1e-12)).max() > 0.05


def test_polar_factor_of_rank_deficient_and_zero():
    a, b = RNG.standard_normal((8, 3)), RNG.standard_normal((3, 20))
    q = polar_factor(a @ b, 1e-12)
    np.testing.assert_allclose(singular_values(q)[:3], 1.0, atol=1e-12)
    assert singular_values(q)[3] < 1e-12
    assert not polar_factor(np.zeros((4, 6)), 1e-12).any()
    assert polar_factor(np.zeros((0, 6)), 1e-12).shape == (0, 6)  # no singular value: no s[0] to read


def test_equivariances_of_the_spectral_map():
    g = RNG.standard_normal((8, 20))
    spec = Orthogonalizer.named("polar_express")
    f = lambda x: spectral_map(x, spec.schedule, spec.normaliser)
    q = np.linalg.qr(RNG.standard_normal((8, 8)))[0]
    assert rel(f(q @ g), q @ f(g)) < 1e-13
    assert rel(f(g.T), f(g).T) < 1e-13
    assert rel(f(4.0 * g), f(g)) < 1e-6  # scale invariance up to eps


def test_normaliser_forms():
    assert Normaliser(1e-7, 1.01, "plus").denominator(2.0) == pytest.approx(2.02 + 1e-7)
    assert Normaliser(1e-7, 1.0, "clamp").denominator(1e-9) == 1e-7


@pytest.mark.parametrize("form", ["plus", "clamp"])
@pytest.mark.parametrize("frobenius", [3e-9, 0.75, 6.0])
def test_a_scaled_denominator_is_the_denominator_of_the_scaled_matrix_over_its_factor(form, frobenius):
    """scaled_denominator(||G'||_F, 2^k) = denominator(2^k ||G'||_F) / 2^k for G = 2^k G', both forms, where eps
    decides the clamp (3e-9 x 2^3 < 1e-7) and where the norm does (the clamped form had no test of its own)."""
    normaliser = Normaliser(1e-7, 1.01, form)
    for k in (-3, 0, 3, 20):
        factor = 2.0**k
        assert normaliser.scaled_denominator(frobenius, factor) == pytest.approx(
            normaliser.denominator(frobenius * factor) / factor, rel=1e-15, abs=0)
    assert Normaliser(1e-7, 1.01, "clamp").scaled_denominator(0.75, 8.0) == 1.01 * 0.75
    plus, built = Normaliser(1e-7, 1.01, "plus"), Normaliser(1e-7, 1.01, "".join(["pl", "us"]))
    # a form read at run time (from a file, say) is read by value
    assert built.denominator(frobenius) == plus.denominator(frobenius) != Normaliser(1e-7, 1.01, "clamp").denominator(
        frobenius)
    assert built.scaled_denominator(frobenius, 8.0) == plus.scaled_denominator(frobenius, 8.0)
    assert Normaliser(1e-7, 1.01, "clamp").scaled_denominator(3e-9, 8.0) == 1e-7 / 8.0
    with pytest.raises(ValueError, match="form"):
        Normaliser(1e-7, 1.0, form="max")


@pytest.mark.parametrize("fmt,dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32), ("fp16", torch.float16)])
def test_rounding_matches_torch_conversion(fmt, dtype):
    x = np.concatenate([RNG.standard_normal(20000) * 10.0 ** RNG.integers(-30, 30, 20000),
                        [0.0, -0.0, 1.0, 1.00390625, 1.01171875, np.inf, -np.inf]])
    if fmt == "fp16":
        x = np.clip(x, -6e4, 6e4)
    expect = torch.from_numpy(x).to(torch.float32).to(dtype).to(torch.float64).numpy()
    np.testing.assert_array_equal(round_to(x, fmt), expect)


def test_bf16_rounding_flags_truncation():
    """Negative control: truncating instead of rounding to nearest even is caught."""
    x = np.array([1.0 + 3 * 2.0**-9])  # halfway region: nearest-even rounds up, truncation down
    truncated = (x.astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32).astype(np.float64)
    assert round_to(x, "bf16")[0] != truncated[0]


def test_ulp():
    assert ulp(np.array([1.0]), "bf16")[0] == 2.0**-7
    assert ulp(np.array([1.0]), "fp32")[0] == np.spacing(np.float32(1.0))
    np.testing.assert_array_equal(ulp(np.array([3.0, -0.7]), "fp64"), np.spacing(np.array([3.0, 0.7])))


def test_round_direction_scales_the_peak_into_half_to_one():
    """oracles.rounding.round_direction scales by the power of two that puts the largest |entry| in [0.5, 1) before
    rounding, as a normaliser's exact scaling does: beside a peak of 1, an fp16 entry of 65 * 2^-30 is a subnormal
    of that scale and keeps 2^-23; scaled one binade lower (peak in [0.25, 0.5)), it would flush to 0."""
    from oracles.rounding import round_direction
    got = round_direction(np.array([1.0, 65 * 2.0**-30]), "fp16")
    np.testing.assert_array_equal(got, [1.0, 2.0**-23])
    lower = np.ldexp(round_to(np.ldexp(np.array([1.0, 65 * 2.0**-30]), -2), "fp16"), 2)
    assert lower[1] == 0.0  # the control: the scale matters for this entry


def test_reference_step_by_hand():
    """One step with svd orthogonalizer, sum momentum and Nesterov, computed by hand."""
    x, g = RNG.standard_normal((4, 6)), RNG.standard_normal((4, 6))
    m0 = RNG.standard_normal((4, 6))
    conv = Conventions(Orthogonalizer.named("svd", compute_dtype="fp64"), compute_dtype="fp64")
    hyper = MuonHyper(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.5, flatten=False)
    x1, m1 = reference_muon_step(x, m0, g, hyper, conv)
    m = 0.9 * m0 + g
    u = g + 0.9 * m
    o = polar_factor(u, 1e-10)
    np.testing.assert_allclose(m1, m, rtol=1e-15)
    np.testing.assert_allclose(x1, x * (1 - 0.1 * 0.5) - 0.1 * np.sqrt(4 / 6) * o, rtol=1e-12, atol=1e-15)


def test_reference_step_flattened_conv_equals_equivalent_matrix():
    x, g = RNG.standard_normal((8, 4, 3, 3)), RNG.standard_normal((8, 4, 3, 3))
    conv = Conventions(Orthogonalizer.named("polar_express"), compute_dtype="fp64")
    hyper = MuonHyper(0.02, 0.95, False, 0.0, flatten=True)
    x1, _ = reference_muon_step(x, np.zeros_like(x), g, hyper, conv)
    x2, _ = reference_muon_step(x.reshape(8, 36), np.zeros((8, 36)), g.reshape(8, 36), hyper, conv)
    np.testing.assert_array_equal(x1.reshape(8, 36), x2)


def test_reference_conventions_are_validated():
    with pytest.raises(ValueError, match="momentum"):
        Conventions(Orthogonalizer.named("svd"), momentum="lerp")
    with pytest.raises(ValueError, match="orthogonalizer"):
        Orthogonalizer.named("muon")


def test_oracles_import_neither_torch_nor_optimizers():
    import subprocess
    import sys
    code = "import sys, oracles; bad = {'torch', 'optimizers'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_spectral_map_survives_values_whose_squares_underflow():
    """Found by Hypothesis: a naive ||G||_F of 1e-163 underflows to 0 and zeroes the result."""
    spec = Orthogonalizer.named("newton_schulz", eps=0.0)
    g = np.array([[5.7e-163, 0.0], [0.0, 2.0e-163]])
    expect = spectral_map(g * 1e160, spec.schedule, spec.normaliser)
    np.testing.assert_allclose(spectral_map(g, spec.schedule, spec.normaliser), expect, rtol=1e-12)


def test_normuon_reference_restores_each_row_blocks_norm_however_small():
    """oracles.normuon_reference.restore_block_norms scales each block of rows to the norm of the same block of the
    update: a block normalised to a norm below 1 too, and a block normalised to zero stays zero."""
    from oracles.normuon_reference import restore_block_norms
    update = RNG.standard_normal((5, 4))
    normed = RNG.standard_normal((5, 4))
    normed[2:3] *= 1e-3  # a block whose normalised norm is below 1
    normed[3:] = 0.0
    got = restore_block_norms(update, normed.copy(), [2, 1, 2])
    np.testing.assert_allclose([np.linalg.norm(got[:2]), np.linalg.norm(got[2:3])],
                               [np.linalg.norm(update[:2]), np.linalg.norm(update[2:3])], rtol=1e-12)
    assert np.all(got[3:] == 0.0)


def test_normuon_reference_trailing_rows_restore_each_slices_norm():
    """oracles.normuon_reference.normalise_rows with rows "trailing" restores each trailing slice's own norm (slices
    of norms about 1 and 10 keep them, and so does a slice of 1e-10 entries, whose normalised norm is below 1: the
    variance eps dominates) and leaves an all-zero slice zero; the rows names are read by value (a name built at
    run time gives the literal's result)."""
    from oracles.normuon_reference import NorMuonHyper, initial_variance, normalise_rows
    o = np.zeros((4, 3, 4))
    o[0], o[1] = RNG.standard_normal((3, 4)), 10 * RNG.standard_normal((3, 4))
    o[3] = 1e-10 * RNG.standard_normal((3, 4))
    hyper = NorMuonHyper(lr=0.1, momentum=0.9, nesterov=False, weight_decay=0.0, flatten=False)
    rows = "".join(["trail", "ing"])
    got, _ = normalise_rows(o, initial_variance(o.shape, False, rows), hyper, rows=rows)
    assert np.all(np.isfinite(got)) and np.all(got[2] == 0.0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=(1, 2)), np.linalg.norm(o, axis=(1, 2)), rtol=1e-12)
    flat = NorMuonHyper(lr=0.1, momentum=0.9, nesterov=False, weight_decay=0.0, flatten=True)
    built = "".join(["mat", "rix"])
    got, v = normalise_rows(o, initial_variance(o.shape, True, built), flat, rows=built)
    want, w = normalise_rows(o, initial_variance(o.shape, True, "matrix"), flat, rows="matrix")
    assert v.shape == w.shape == (1, 4) and np.array_equal(got, want)
