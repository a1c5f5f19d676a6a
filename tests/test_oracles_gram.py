"""The Gram path of the spectral oracles (issue 13): a large, well-conditioned matrix's spectral map, polar
factor and singular values from the eigendecomposition of its short side's Gram matrix agree with the SVD
path (the old arithmetic, re-stated here) to 1e-12; rank-deficient and ill-conditioned matrices take the
SVD; small matrices keep the SVD bit for bit; the memo never serves another matrix's decomposition. Both
paths are right up to fp64's range."""

import dataclasses
import math

import numpy as np
import pytest
import scipy.linalg

from oracles import Orthogonalizer, polar_factor, singular_values, spectral_map
from oracles import spectral
from oracles.coefficients import YOU_QUINTICS
from oracles.spectral import Normaliser

M, N = spectral.GRAM_MIN_SIDE, 2 * spectral.GRAM_MIN_SIDE + 37
AGREE = 1e-12
SCHEDULES = {
    "polar_express": (Orthogonalizer.named("polar_express").schedule, Orthogonalizer.named("polar_express").normaliser),
    "newton_schulz": (Orthogonalizer.named("newton_schulz").schedule, Orthogonalizer.named("newton_schulz").normaliser),
    "you": (YOU_QUINTICS, Normaliser(1e-7, 1.0)),
}


_GESVD: dict[int, tuple] = {}


def gesvd(g):
    """scipy's gesvd of g, once per matrix object of this module (the tests' time is these SVDs)."""
    key = id(g)
    if key not in _GESVD or _GESVD[key][0] is not g:
        _GESVD[key] = (g, scipy.linalg.svd(g, full_matrices=False, lapack_driver="gesvd"))
    return _GESVD[key][1]


def svd_spectral_map(g, schedule, normaliser):
    """The old path: one gesvd, f applied to the singular values."""
    u, s, vt = gesvd(g)
    d = normaliser.denominator(spectral.frobenius(s))
    return (u * spectral.compose(schedule, s / d)) @ vt


def svd_polar(g, rcond):
    u, s, vt = gesvd(g)
    keep = s > rcond * s[0]
    return u[:, keep] @ vt[keep, :]


def svd_values(g):
    return scipy.linalg.svd(g, compute_uv=False, lapack_driver="gesvd")


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def with_spectrum(rng, s, m=M, n=N):
    u, _ = np.linalg.qr(rng.standard_normal((m, len(s))))
    v, _ = np.linalg.qr(rng.standard_normal((n, len(s))))
    return (u * s) @ v.T


def matrices():
    rng = np.random.default_rng(13)
    return {
        "gaussian": (rng.standard_normal((M, N)), "gram"),
        "gaussian_tall": (rng.standard_normal((N, M)), "gram"),
        "condition_5": (with_spectrum(rng, np.geomspace(1.0, 0.2, M)), "gram"),
        "rank_deficient": (rng.standard_normal((M, 40)) @ rng.standard_normal((40, N)), "svd"),
        "low_rank_tail": (with_spectrum(rng, np.r_[np.ones(M // 8), np.full(M - M // 8, 1e-2)]), "svd"),
        "condition_1e3": (with_spectrum(rng, np.geomspace(1.0, 1e-3, M)), "svd"),
        "condition_1e12_tall": (with_spectrum(rng, np.geomspace(1.0, 1e-12, M)).T.copy(), "svd"),
    }


MATRICES = matrices()


@pytest.fixture(autouse=True)
def fresh_cache():
    spectral.clear_cache()
    yield
    spectral.clear_cache()


@pytest.mark.parametrize("name", list(MATRICES))
def test_the_gram_path_agrees_with_the_svd_and_falls_back_where_ill_conditioned(name):
    """Every map on random, rank-deficient and ill-conditioned inputs agrees with the SVD path to 1e-12,
    and the path taken is the one the criterion (GRAM_MAX_CONDITION, GRAM_RTOL) states."""
    g, expected_path = MATRICES[name]
    for schedule, normaliser in SCHEDULES.values():
        assert rel(spectral_map(g, schedule, normaliser), svd_spectral_map(g, schedule, normaliser)) < AGREE, name
        assert spectral.path(g) == expected_path
    rcond = float(np.finfo(np.float32).eps) * max(g.shape)
    assert rel(polar_factor(g, rcond), svd_polar(g, rcond)) < AGREE
    values, old = singular_values(g), svd_values(g)
    assert np.max(np.abs(values - old) / old[0]) < AGREE
    if expected_path == "gram":
        assert np.max(np.abs(values - old) / old) < AGREE  # each one relative to itself, not just to s_max
    assert spectral.path(g) == expected_path


@pytest.mark.parametrize("shape", [(4, 6), (M, M + 3)])
def test_a_zero_matrix_maps_to_zero_without_eps(shape):
    """d = 0 (a zero matrix, eps 0): the spectral map is the zero matrix, not 0/0, small or large; the polar
    factor and the singular values are zero too."""
    g = np.zeros(shape)
    for schedule, _ in SCHEDULES.values():
        got = spectral_map(g, schedule, Normaliser(0.0, 1.0))
        assert got.shape == shape and np.array_equal(got, g)
    assert np.array_equal(polar_factor(g, 1e-6), g) and not singular_values(g).any()


@pytest.mark.parametrize("shape", [(M + 1,), (2, 3, 4)])
def test_only_a_matrix_is_mapped(shape):
    """A vector (longer than GRAM_MIN_SIDE: not taken for a large matrix) or a stack is refused as no matrix."""
    g = np.ones(shape)
    schedule, normaliser = SCHEDULES["polar_express"]
    with pytest.raises(ValueError, match="expected a matrix"):
        spectral_map(g, schedule, normaliser)
    with pytest.raises(ValueError, match="expected a matrix"):
        polar_factor(g, 1e-6)
    assert spectral.path(g) == "" and not spectral._CACHE


def test_a_large_matrix_of_tiny_entries_is_normalised_first():
    """2^-520 G (entries ~1e-157): its Gram matrix unnormalised would be subnormal (products ~1e-313, ten digits);
    _normalised's power of two is at its own largest entry (not at 1), so it takes the Gram path at full accuracy."""
    g = MATRICES["gaussian"][0] * 2.0**-520
    assert spectral._normalised(g)[1] < -500
    schedule, normaliser = SCHEDULES["polar_express"]
    got = spectral_map(g, schedule, normaliser)
    assert spectral.path(g) == "gram"
    assert rel(got, svd_spectral_map(g, schedule, normaliser)) < AGREE


def test_a_large_matrix_of_subnormal_entries_maps_unscaled():
    """_normalised leaves a matrix whose largest entry is below 2^-1000 as it is (2^-e would overflow from
    e < -1023: a subnormal largest entry): such a large matrix maps, and as the SVD path says."""
    g = MATRICES["gaussian"][0] * 2.0**-1070
    assert np.max(np.abs(g)) < np.finfo(np.float64).tiny and spectral._normalised(g)[1] == 0
    schedule, normaliser = SCHEDULES["polar_express"]
    got, want = spectral_map(g, schedule, normaliser), svd_spectral_map(g, schedule, normaliser)
    assert np.max(np.abs(got - want)) <= 1e-9 * np.max(np.abs(want))  # subnormal results: fewer digits


def test_a_large_matrix_whose_gram_matrix_overflows_takes_the_svd():
    """2^1000 G with one subnormal entry cannot be normalised exactly (that entry would be lost), so it stays
    unscaled and its Gram matrix (~2^2000) is infinite: the eigensolver must take it without a finiteness check
    and the criterion reject it, and the maps are the SVD's (an eigensolver that refuses inf raises instead)."""
    g = MATRICES["gaussian"][0] * 2.0**1000
    g[0, 0] = 5e-324
    assert spectral._normalised(g)[1] == 0 and not np.all(np.isfinite(g @ g.T))
    got = singular_values(g)
    assert spectral.path(g) == "svd"
    want = svd_values(g)
    assert np.max(np.abs(got - want)) <= 1e-14 * want[0]


def test_the_svd_path_falls_back_to_gesvd_where_gesdd_fails(monkeypatch):
    """A large matrix the criterion sends to the SVD takes gesdd (tested above to agree with gesvd), and
    gesvd, exactly the old arithmetic, where gesdd does not converge."""
    g = MATRICES["rank_deficient"][0]
    schedule, normaliser = SCHEDULES["polar_express"]
    real = scipy.linalg.svd

    def gesdd_fails(a, *args, lapack_driver="gesdd", **kwargs):
        if lapack_driver == "gesdd":
            raise np.linalg.LinAlgError("SVD did not converge")
        return real(a, *args, lapack_driver=lapack_driver, **kwargs)

    monkeypatch.setattr(scipy.linalg, "svd", gesdd_fails)
    assert np.array_equal(spectral_map(g, schedule, normaliser), svd_spectral_map(g, schedule, normaliser))
    old = svd_values(g)
    assert np.max(np.abs(singular_values(g) - old)) < 1e-14 * old[0]


def test_small_matrices_keep_the_svd_and_are_not_memoised():
    rng = np.random.default_rng(5)
    g = rng.standard_normal((spectral.GRAM_MIN_SIDE - 1, spectral.GRAM_MIN_SIDE + 100))
    schedule, normaliser = SCHEDULES["newton_schulz"]
    assert np.array_equal(spectral_map(g, schedule, normaliser), svd_spectral_map(g, schedule, normaliser))
    assert np.array_equal(singular_values(g), svd_values(g))
    assert not spectral._CACHE and spectral.path(g) == ""


def test_a_scaled_matrix_shares_the_decomposition_and_keeps_its_own_normaliser():
    """Gradients x 2^10 (the scale check) reuse the decomposition of the run without; the normaliser's eps
    still sees the scale (a tiny matrix and the same one x 2^40 map differently, each as the SVD says)."""
    g = MATRICES["gaussian"][0] * 1e-9
    schedule, normaliser = SCHEDULES["polar_express"]
    small = spectral_map(g, schedule, normaliser)
    assert len(spectral._CACHE) == 1
    big = spectral_map(g * 2.0**40, schedule, normaliser)
    assert len(spectral._CACHE) == 1, "the x 2^40 matrix was decomposed again"
    assert rel(small, svd_spectral_map(g, schedule, normaliser)) < AGREE
    assert rel(big, svd_spectral_map(g * 2.0**40, schedule, normaliser)) < AGREE
    assert rel(small, big) > 1e-4, "eps 1e-7 against ||G|| ~ 7e-7 must show"


def test_power_of_two_multiples_share_the_decomposition_up_to_the_cap():
    """_normalised divides by 2^e, e the exponent of the largest |entry| as frexp gives it ([0.5, 1) x 2^e), capped
    at 1023: G with max |entry| exactly 1 and its multiples by 2^10, 2^1022 (the cap's own exponent) and 2^-2 are
    one matrix to the memo; G x 2^1023, above the cap, is divided by 2^1023 (2^1024 is no float) and has G's polar
    factor."""
    g = MATRICES["gaussian"][0] / np.max(np.abs(MATRICES["gaussian"][0]))
    assert np.max(np.abs(g)) == 1.0
    schedule, normaliser = SCHEDULES["polar_express"]
    for k in (0, 10, 1022, -2):  # -2: max |entry| 1/4, frexp's exponent -1
        spectral_map(g * 2.0**k, schedule, normaliser)
        assert len(spectral._CACHE) == 1, f"G x 2^{k} was decomposed again"
    rcond = float(np.finfo(np.float32).eps) * N
    assert spectral._normalised(g * 2.0**1023)[1] == 1023
    assert rel(polar_factor(g * 2.0**1023, rcond), polar_factor(g, rcond)) < AGREE


@pytest.mark.parametrize("record, field", [(Normaliser(1e-7, 1.0), "eps"),
                                           (spectral._Gram(np.eye(2), np.ones(2), True), "lam"),
                                           (spectral._SVD(np.eye(2), np.ones(2), np.eye(2)), "s")])
def test_the_spectral_records_are_frozen(record, field):
    """A normaliser is a value that conventions share, and a memoised decomposition is served to every later call
    on its matrix: neither can be changed in place."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(record, field, None)


def test_the_memo_never_serves_another_matrix():
    """Negative control: one entry changed by one ulp is another matrix, decomposed anew; and a
    decomposition swapped in under the wrong key is caught by the agreement check above."""
    g = MATRICES["gaussian"][0].copy()
    schedule, normaliser = SCHEDULES["polar_express"]
    first = spectral_map(g, schedule, normaliser)
    g[3, 7] = np.nextafter(g[3, 7], np.inf)
    second = spectral_map(g, schedule, normaliser)
    assert len(spectral._CACHE) == 2
    assert not np.array_equal(first, second)
    other = MATRICES["condition_5"][0]
    spectral_map(other, schedule, normaliser)
    key = spectral._key(spectral._normalised(g)[0])
    spectral._CACHE[key] = spectral._CACHE[spectral._key(spectral._normalised(other)[0])]
    assert rel(spectral_map(g, schedule, normaliser), svd_spectral_map(g, schedule, normaliser)) > 0.1


def test_the_memo_keeps_the_most_recently_used_decompositions(monkeypatch):
    """CACHE_SIZE decompositions (2 here), the least recently used evicted: a hit on a Gram or an SVD entry
    makes it the most recent (the memo's order; without it, the entry just used would go first)."""
    monkeypatch.setattr(spectral, "CACHE_SIZE", 2)
    rng = np.random.default_rng(21)
    a, b, c = (rng.standard_normal((M, 2 * M)) for _ in range(3))  # aspect 2: condition ~6, the Gram path
    d = with_spectrum(rng, np.geomspace(1.0, 1e-3, M), M, M + 8)  # ill-conditioned: the SVD path
    singular_values(a)
    singular_values(b)
    singular_values(a)  # a hit: b is now the oldest
    singular_values(c)
    assert [spectral.path(x) for x in (a, b, c)] == ["gram", "", "gram"] and len(spectral._CACHE) == 2
    singular_values(d)
    singular_values(c)  # a Gram hit
    singular_values(d)  # an SVD hit: c is now the oldest
    singular_values(a)
    assert [spectral.path(x) for x in (a, c, d)] == ["gram", "", "svd"] and len(spectral._CACHE) == 2


def test_the_error_bound_rejects_what_it_cannot_vouch_for():
    """The criterion's parts: a condition number above GRAM_MAX_CONDITION, or a bound above GRAM_RTOL
    (a wrongly small GRAM_EIGH_ERROR would accept more), each sends a matrix to the SVD."""
    rng = np.random.default_rng(7)
    gram = spectral._gram(with_spectrum(rng, np.geomspace(1.0, 1.0 / (2 * spectral.GRAM_MAX_CONDITION), M)))
    assert not spectral._well_conditioned(gram.lam)
    gram = spectral._gram(MATRICES["gaussian"][0])
    assert spectral._well_conditioned(gram.lam) and spectral._values_ok(gram)
    lam = gram.lam / gram.lam[-1]
    assert spectral._gram_error(lam, lam**-0.5, -0.5 * lam**-1.5) < spectral.GRAM_RTOL
    assert spectral._gram_error(lam, lam**-0.5, -0.5 * lam**-1.5 * 1e3) > spectral.GRAM_RTOL


def bound(lam, h, dh):
    """_gram_error's first-order bound written from its definition: singular values s_i = sqrt(l_i) map to
    y_i = s_i h(l_i); each l_i off by GRAM_EIGH_ERROR l_max moves y_i by s_i |h'(l_i)| GRAM_EIGH_ERROR l_max;
    the bound is ||dy|| / ||y||."""
    s = np.sqrt(np.clip(lam, 0.0, None))
    y, dy = s * h, s * np.abs(dh) * spectral.GRAM_EIGH_ERROR * np.max(lam)
    return math.sqrt(sum(v * v for v in dy)) / math.sqrt(sum(v * v for v in y))


def test_the_error_bound_is_its_definition():
    """_gram_error by value against `bound`, for a polynomial schedule's h and for the polar factor's
    h = l^-1/2, where it is GRAM_EIGH_ERROR / 2 times the root mean square of (s_max / s_i)^2 (module doc);
    a rounding-negative eigenvalue counts as 0; no size or a non-finite h' is no bound (inf). (abs=0: the
    bounds are ~1e-14, within pytest.approx's default absolute tolerance of 1e-12 of anything small.)"""
    rng = np.random.default_rng(11)
    lam = np.sort(rng.uniform(0.02, 1.0, 40))
    for schedule, _ in SCHEDULES.values():
        h, dh = spectral._schedule_h(schedule, lam)
        assert spectral._gram_error(lam, h, dh) == pytest.approx(bound(lam, h, dh), rel=1e-12, abs=0)
    unit = lam / lam[-1]  # as _polar_ok has them: l_max = 1
    assert spectral._gram_error(unit, unit**-0.5, -0.5 * unit**-1.5) == pytest.approx(
        spectral.GRAM_EIGH_ERROR / 2 * math.sqrt(np.mean(unit**-2.0)), rel=1e-12, abs=0)
    with_negative = np.r_[-1e-17, lam]
    h, dh = np.r_[5.0, lam**-0.5], np.r_[7.0, -0.5 * lam**-1.5]
    assert spectral._gram_error(with_negative, h, dh) == pytest.approx(bound(lam, h[1:], dh[1:]), rel=1e-12, abs=0)
    assert spectral._gram_error(np.zeros(3), np.ones(3), np.ones(3)) == math.inf
    assert spectral._gram_error(lam, lam**-0.5, np.r_[np.inf, lam[1:]]) == math.inf


KAPPAS = np.linspace(2.0, 9.99, 400)
"""Condition numbers across the Gram path's thresholds (GRAM_RTOL and GRAM_MAX_CONDITION)."""


def spectrum(kappa, n=24):
    """A Gram matrix's eigenvalues (ascending) whose matrix has s_max 3 and condition `kappa`: all but the
    largest at the smallest (the root mean square of (s_max / s_i)^2 is then about kappa^2, so both
    thresholds fall near kappa 7.5)."""
    return 9.0 * np.r_[np.full(n - 1, 1.0 / kappa**2), 1.0]


def gram_of(lam):
    """A Gram decomposition with eigenvalues `lam` (ascending) and identity eigenvectors."""
    return spectral._Gram(np.eye(len(lam)), np.asarray(lam, dtype=np.float64), True)


def test_each_map_takes_the_gram_path_exactly_where_its_criterion_says():
    """_polar_ok and _values_ok by value over condition numbers 2-10 (the accept of the spectral map is the
    bound above): the polar factor where GRAM_EIGH_ERROR / 2 rms((s_max / s_i)^2) <= GRAM_RTOL and every s_i is
    at least 4 rcond s_max above the cut-off, the singular values where GRAM_EIGH_ERROR s_max^2 / (2 s_min^2) <=
    GRAM_RTOL; both outcomes occur on the grid (the thresholds are inside it)."""
    eps, rtol = spectral.GRAM_EIGH_ERROR, spectral.GRAM_RTOL
    polar, values = [], []
    for kappa in KAPPAS:
        lam = spectrum(kappa)
        gram = gram_of(lam)
        relative = lam[-1] / lam
        expected = eps / 2 * math.sqrt(np.mean(relative**2)) <= rtol
        assert spectral._polar_ok(gram, 1e-6) == expected, kappa
        assert not spectral._polar_ok(gram, 1.01 / (4 * kappa))  # s_min within 4 rcond s_max of the cut-off
        assert spectral._polar_ok(gram, 0.99 / (4 * kappa)) == expected
        assert spectral._values_ok(gram) == (eps * relative[0] / 2 <= rtol), kappa
        polar.append(expected)
        values.append(eps * relative[0] / 2 <= rtol)
    assert any(polar) and not all(polar) and any(values) and not all(values)
    # the condition number is s_max / s_min, not against the second largest (all but the largest are equal here)
    assert spectral._well_conditioned(spectrum(9.99)) and not spectral._well_conditioned(spectrum(20.0))


def test_each_criterion_reads_the_extreme_eigenvalues():
    """The criteria by value where only the smallest eigenvalue decides (the grid above has all but the largest
    equal): a condition of 10.5 is not well conditioned; a smallest singular value under the rank gap fails the
    polar factor's criterion though the next is above it; and the singular values' bound GRAM_EIGH_ERROR l_max /
    (2 l_min) crosses GRAM_RTOL at l_max / l_min = 2 GRAM_RTOL / (16 eps), about 56 (LAPACK's eigh error taken as
    16 eps), read at l_min, not the next eigenvalue."""
    assert not spectral._well_conditioned(np.array([1.0 / 10.5**2, 1.0, 1.0, 1.0]))
    assert not spectral._well_conditioned(np.array([1e-4, 1.0, 1.0, 1.0]))
    gap = gram_of([0.2**2, 0.5**2, 1.0])  # s_min 0.2, the next 0.5: the rank gap 4 rcond between them at rcond 0.1
    assert spectral._polar_ok(gap, 0.01) and not spectral._polar_ok(gap, 0.1)
    assert spectral._values_ok(gram_of([1.0 / 55, 1.0 / 10, 1.0]))
    assert not spectral._values_ok(gram_of([1.0 / 58, 1.0 / 10, 1.0]))


def test_the_gram_path_starts_at_a_short_side_of_512():
    """GRAM_MIN_SIDE as documented: a matrix is large from a short side of 512."""
    assert spectral._large(np.zeros((512, 600))) and spectral._large(np.zeros((700, 512)))
    assert not spectral._large(np.zeros((511, 600))) and not spectral._large(np.zeros((600, 511)))


def test_the_frobenius_norm_of_a_zero_or_empty_spectrum_is_zero():
    assert spectral.frobenius(np.zeros(4)) == 0.0 and spectral.frobenius(np.zeros(0)) == 0.0
    assert spectral.frobenius(np.array([3.0, 4.0])) == 5.0


def test_a_large_matrix_whose_largest_entries_are_negative_is_normalised_by_them():
    """_normalised's power of two is at the largest |entry|, negative ones too: -2^1000 [I 0] (no positive entry,
    condition 1) takes the Gram path; unnormalised, its Gram matrix (2^2000) is no float."""
    g = -np.eye(M, 2 * M) * 2.0**1000
    assert spectral._normalised(g)[1] == 1001
    schedule, normaliser = SCHEDULES["polar_express"]
    got = spectral_map(g, schedule, normaliser)
    assert spectral.path(g) == "gram"
    assert np.max(np.abs(got - svd_spectral_map(g, schedule, normaliser))) <= 1e-12


def test_a_steep_map_of_a_well_conditioned_matrix_takes_the_svd():
    """The spectral map's own error bound, not only the condition number, decides its path: Polar Express's first
    polynomial three times from 20 x the matrix's normalised start has a bound of ~3e-13 on the Gaussian matrix
    (condition ~6), above GRAM_RTOL, so the map is the SVD's."""
    g = MATRICES["gaussian"][0]
    schedule = [Orthogonalizer.named("polar_express").schedule[0]] * 3
    normaliser = Normaliser(1e-7, 0.05)
    got = spectral_map(g, schedule, normaliser)
    assert spectral.path(g) == "svd" and spectral._well_conditioned(spectral._gram(g).lam)
    assert rel(got, svd_spectral_map(g, schedule, normaliser)) < AGREE


def test_a_large_matrix_that_each_map_meets_first_is_memoised_on_its_path():
    """Each map alone, from an empty memo: a well-conditioned large matrix is decomposed on the Gram path and
    an ill-conditioned one on the SVD (the test above reads the path after the spectral map, which the polar
    factor and the singular values then reuse)."""
    rcond = float(np.finfo(np.float32).eps) * N
    wider = np.random.default_rng(4).standard_normal((M + 1, 2 * M))  # a short side above GRAM_MIN_SIDE
    for g, expected_path in (MATRICES["gaussian"], MATRICES["condition_1e3"], (wider, "gram")):
        for run in (lambda: polar_factor(g, rcond), lambda: singular_values(g)):
            spectral.clear_cache()
            run()
            assert spectral.path(g) == expected_path, g.shape


def test_a_matrix_whose_singular_values_could_overflow_is_scaled_first():
    """_within_range's window: entries below fp64's max / 4 whose singular values (up to max|g| sqrt(size))
    could exceed it (the margin: the normaliser's scale). 0.9 x 2^1022 G (max |entry| 1) maps as G does; unscaled,
    its Frobenius norm overflows."""
    g = np.random.default_rng(8).standard_normal((12, 20))
    g /= np.max(np.abs(g))
    sch, normaliser = Orthogonalizer.named("polar_express").schedule, Normaliser(0.0, 1.01)
    big = g * (0.9 * 2.0**1022)
    assert np.max(np.abs(big)) < np.finfo(np.float64).max / 4 < 0.9 * 2.0**1022 * math.sqrt(big.size) / 2
    with np.errstate(over="ignore"):
        assert np.linalg.norm(big) == math.inf  # the control: unscaled, the normaliser is no float
    for got, want in ((spectral_map(big, sch, normaliser), spectral_map(g, sch, normaliser)),
                      (polar_factor(big, 1e-6), polar_factor(g, 1e-6))):
        assert np.all(np.isfinite(got)) and np.max(np.abs(got - want)) <= 1e-12
    # a finite norm within a hundredth of fp64's largest: the normaliser's 1.01 x ||G||_F is no float unscaled
    flat = np.full((2, 2), 0.995 * np.finfo(np.float64).max / 2)
    frobenius = 2 * float(flat[0, 0])  # its one singular value
    assert math.isfinite(frobenius) and not math.isfinite(1.01 * frobenius)
    got, want = spectral_map(flat, sch, normaliser), spectral_map(np.ones((2, 2)), sch, normaliser)
    assert np.max(np.abs(got - want)) <= 1e-12


def old_round_to_bf16(x):
    """oracles.rounding.round_to(x, "bf16") before issue 13 (uint64 arithmetic, np.where)."""
    single = np.asarray(x, dtype=np.float64).astype(np.float32)
    bits = single.view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) >> 16) << 16
    return np.where(np.isfinite(single), rounded, bits).astype(np.uint32).view(np.float32).astype(np.float64)


def test_bf16_rounding_is_the_old_rounding_bit_for_bit():
    """round_to(., "bf16") now rounds in place on the uint32 pattern (2.5x faster on 2048 x 4096): every
    float32 pattern class (ties to even, the largest finite values that round to inf, subnormals, inf,
    NaN, signed zeros) rounds to the same bits as before."""
    from oracles.rounding import round_to
    rng = np.random.default_rng(3)
    f32 = np.finfo(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, f32.max, -f32.max, f32.tiny, f32.tiny / 3, 1e-45,
                        1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-9, -(1.0 + 2**-9), 3 * 2**-9 + 1.0, 1e300, -1e300])
    with np.errstate(invalid="ignore", over="ignore"):
        patterns = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
        ties = (np.arange(1, 2**16, dtype=np.uint32) << 15 | np.uint32(0x8000)).view(np.float32)
        for x in (special, patterns.astype(np.float64), ties.astype(np.float64),
                  rng.standard_normal(100_000) * 10.0 ** rng.integers(-45, 45, 100_000)):
            new, old = round_to(x, "bf16"), old_round_to_bf16(x)
            assert np.array_equal(new.view(np.uint64), old.view(np.uint64))


@pytest.mark.parametrize("shape", [(12, 20), (spectral.GRAM_MIN_SIDE, 2 * spectral.GRAM_MIN_SIDE)])
def test_the_oracles_are_right_up_to_fp64s_range(shape):
    """The FP64 oracles (spectral map, polar factor; singular values where they are floats) of 2^k G equal
    G's (times 2^k for the singular values) for k up to 1020 (~1e307), on the SVD path and on the large
    matrices' Gram path. Before: the Gram path's polar factor was 0.14 off from 2^512 ((lam 4^k)^-1/2
    overflowed), from 2^1001 every large matrix was left unscaled (its Gram matrix overflowed: NaN), and
    where the norm itself exceeded fp64's range the spectral map was NaN."""
    g = np.random.default_rng(5).standard_normal(shape)
    sch, normaliser = Orthogonalizer.named("polar_express").schedule, Normaliser(0.0, 1.01)
    rcond = 1e-6 * max(shape)
    base = (spectral_map(g, sch, normaliser), polar_factor(g, rcond), singular_values(g))
    for k in (100, 512, 800, 1001, 1020):
        s = 2.0**k
        got = [spectral_map(g * s, sch, normaliser), polar_factor(g * s, rcond)]
        if math.log2(base[2][0]) + k < 1024:  # (512 x 1024 at 2^1020: s_max ~2^1026 is no float)
            got.append(singular_values(g * s) / s)
        for a, b in zip(got, base):
            assert np.all(np.isfinite(a)) and np.max(np.abs(a - b)) <= 1e-12 * np.max(np.abs(b)), k
    # negative control: with eps 1e-7 against ||G|| ~ 1e-10, another map (the same decomposition: cheap)
    tiny = spectral_map(g * 2.0**-40, sch, Normaliser(1e-7, 1.01))
    assert np.max(np.abs(tiny - base[0])) > 1e-3 * np.max(np.abs(base[0]))


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_the_schedules_h_and_its_derivative_match_the_composed_polynomial(name):
    """_schedule_h: h(l) with f(x) = x h(x^2) the composed schedule (checked against iterating x <- p(x)), and h'(l)
    against central differences of h, at squared singular values across (0, 1]."""
    schedule = SCHEDULES[name][0]
    lam = np.geomspace(1e-4, 1.0, 9)
    h, dh = spectral._schedule_h(schedule, lam)
    x = np.sqrt(lam)
    for a, b, c in schedule:
        x = a * x + b * x**3 + c * x**5
    np.testing.assert_allclose(h * np.sqrt(lam), x, rtol=1e-12)
    step = 1e-6 * lam
    numeric = (spectral._schedule_h(schedule, lam + step)[0] - spectral._schedule_h(schedule, lam - step)[0]) / (2 * step)
    np.testing.assert_allclose(dh, numeric, rtol=1e-5)
