"""The FP64 Dion2 / NorDion2 oracles against first principles, each with negative controls."""

import math

import numpy as np
import pytest

from oracles import (Conventions, Dion2Hyper, MuonHyper, NorDion2Hyper, NorMuonHyper, Orthogonalizer,
                     initial_row_variance, initial_variance, lr_scale, polar_factor, reference_dion2_step,
                     reference_muon_step, reference_nordion2_step, reference_normuon_step, select)

RNG = np.random.default_rng(2026)
SVD = Conventions(Orthogonalizer.named("svd", compute_dtype="fp64"), compute_dtype="fp64")
PE = Conventions(Orthogonalizer.named("polar_express"), compute_dtype="fp64")


def hyper(fraction=0.25, flatten=True, wd=0.1):
    return Dion2Hyper(lr=0.02, fraction=fraction, ef_decay=0.9, weight_decay=wd, flatten=flatten)


def test_select_takes_the_largest_l1_norms_and_breaks_ties_by_lower_index():
    idx, margin = select(np.array([1.0, 3.0, 2.0, 3.0, 0.5]), 0.4)
    assert idx.tolist() == [1, 3] and margin == pytest.approx(1 / 3)
    idx, margin = select(np.array([2.0, 1.0, 2.0, 2.0]), 0.5)
    assert idx.tolist() == [0, 2] and margin == 0.0            # a tie at the cut: ill-posed
    assert select(np.zeros(4), 0.25) == (pytest.approx([0]), 0.0)
    idx, margin = select(np.array([1.0, 2.0]), 1.0)
    assert idx.tolist() == [0, 1] and margin == math.inf       # everything taken: nothing to tie


def test_select_margin_is_the_relative_gap_at_the_cut_at_any_scale():
    """The margin (kth - next) / kth where the k-th norm is twice the next or more, and where norms are below 1;
    blocks covering more slices than there are are refused as fewer are; a block of more than 256 slices taken
    whole (ints compared by value) has nothing to tie."""
    assert select(np.array([4.0, 1.0]), 0.5) == (pytest.approx([0]), 0.75)
    assert select(np.array([0.1, 0.4]), 0.5) == (pytest.approx([1]), pytest.approx(0.75))
    with pytest.raises(ValueError, match="do not cover"):
        select(np.ones(6), 0.5, [4, 3])
    idx, margin = select(np.arange(300.0), 1.0)
    assert idx.tolist() == list(range(300)) and margin == math.inf


def test_nordion2_variance_decays_by_beta2_of_any_value():
    """The selected rows' second moment is beta2 v + (1 - beta2) mean(o^2) for beta2 below 0.5 too, where
    1 % beta2 is not 1 - beta2 (every case's beta2 is above 0.5)."""
    from oracles.dion2_reference import normalise_selected_rows
    update = RNG.standard_normal((4, 6))
    v0 = np.abs(RNG.standard_normal((1, 4)))
    h = NorDion2Hyper(lr=0.02, fraction=0.5, ef_decay=0.9, weight_decay=0.0, flatten=False, beta2=0.3)
    _, v = normalise_selected_rows(update, [np.array([0, 2])], v0, h)
    want = v0.copy()
    want[0, [0, 2]] = 0.3 * v0[0, [0, 2]] + 0.7 * np.mean(update[[0, 2]] ** 2, axis=1)
    np.testing.assert_allclose(v, want, rtol=1e-14)


def test_select_count_is_ceil_of_fraction_and_at_least_one():
    from oracles.dion2_reference import select_count
    for n, fraction, k in [(12, 0.25, 3), (13, 0.25, 4), (5, 0.01, 1), (8, 0.5, 4), (1, 0.25, 1)]:
        assert select(np.arange(n, dtype=float), fraction)[0].size == k == select_count(n, fraction)
    assert select_count(0, 0.25) == 0  # none of none (an empty block of a local scope)


def test_local_scope_blocks_select_per_block():
    norms = np.array([9.0, 8.0, 7.0, 1.0, 2.0, 3.0])
    assert select(norms, 0.3)[0].tolist() == [0, 1]
    assert select(norms, 0.3, [3, 3])[0].tolist() == [0, 5]
    assert select(norms, 0.3, [4, 2, 0])[0].tolist() == [0, 1, 5]
    with pytest.raises(ValueError, match="do not cover"):
        select(norms, 0.5, [3, 2])


def explicit_dion2(x, m, g, h, conv):
    """Dion2 on one matrix written out row by row (rows are the shorter side here)."""
    m = m + g
    norms = [sum(abs(v) for v in row) for row in m]
    k = max(1, math.ceil(h.fraction * len(norms)))
    chosen = sorted(sorted(range(len(norms)), key=lambda i: (-norms[i], i))[:k])
    o = polar_factor(m[chosen], 0.0)
    x = x * (1 - h.lr * h.weight_decay)
    scale = lr_scale(x.shape, conv.lr_scale, conv.lr_dims)
    for j, i in enumerate(chosen):
        x[i] -= h.lr * scale * o[j]
        m[i] *= h.ef_decay
    return x, m


def test_dion2_step_equals_the_explicit_definition():
    x, m, g = (RNG.standard_normal((6, 10)) for _ in range(3))
    h = hyper(0.5, flatten=False)
    got_x, got_m, margin = reference_dion2_step(x, m, g, h, SVD)
    want_x, want_m = explicit_dion2(x, m, g, h, SVD)
    assert np.allclose(got_x, want_x, rtol=0, atol=1e-14) and np.array_equal(got_m, want_m) and margin > 0


def test_dion2_selects_columns_of_a_tall_matrix():
    x, m, g = (RNG.standard_normal((10, 4)) for _ in range(3))
    new_x, new_m, _ = reference_dion2_step(x, m, g, hyper(0.25, flatten=False, wd=0.0), SVD)
    touched = np.any(new_x != x, axis=0)
    decayed = np.any(new_m != m + g, axis=0)
    assert touched.sum() == 1 and np.array_equal(touched, decayed)
    assert np.argmax(np.abs(m + g).sum(axis=0)) == np.flatnonzero(touched)[0]


@pytest.mark.parametrize("shape", [(8, 4, 5), (8, 4, 3, 3), (6, 3, 2, 3, 3), (40, 2, 2, 2)])
def test_flattened_conv_steps_as_its_2d_matrix(shape):
    flat = (shape[0], math.prod(shape[1:]))
    x, m, g = (RNG.standard_normal(shape) for _ in range(3))
    a = reference_dion2_step(x, m, g, hyper(), PE)
    b = reference_dion2_step(x.reshape(flat), m.reshape(flat), g.reshape(flat), hyper(), PE)
    assert np.array_equal(a[0].reshape(flat), b[0]) and np.array_equal(a[1].reshape(flat), b[1])


def test_selection_over_kernel_dims_is_not_the_flattened_step():
    """Negative control: dion's unflattened conv selection (rows of kh x kw kernels) moves other entries."""
    shape = (8, 4, 3, 3)
    x, m, g = (RNG.standard_normal(shape) for _ in range(3))
    right = reference_dion2_step(x, m, g, hyper(), PE)[0]
    wrong = reference_dion2_step(x, m, g, hyper(flatten=False), PE)[0]
    assert np.linalg.norm(wrong - right) > 0.1 * np.linalg.norm(right - x * 0.998)


@pytest.mark.parametrize("conv", [SVD, PE])
def test_fraction_one_is_muon_with_momentum_ef_decay(conv):
    """Dion2 (fraction 1) keeps ef(M+G): U_k = ef U_{k-1} + G_k, Muon's sum momentum with mu = ef."""
    x = RNG.standard_normal((6, 9))
    h = hyper(1.0, flatten=False)
    mh = MuonHyper(lr=h.lr, momentum=h.ef_decay, nesterov=False, weight_decay=h.weight_decay, flatten=False)
    xd, md, xm, mm = x, np.zeros_like(x), x, np.zeros_like(x)
    for _ in range(4):
        g = RNG.standard_normal(x.shape)
        xd, md, _ = reference_dion2_step(xd, md, g, h, conv)
        xm, mm = reference_muon_step(xm, mm, g, mh, conv)
        assert np.allclose(xd, xm, rtol=0, atol=1e-14)
    assert not np.allclose(md, mm)  # the buffers differ (ef (M+G) vs M): only the updates agree


def test_fraction_below_one_is_not_muon():
    """Negative control of the relation above: with fraction < 1 most rows are left unchanged."""
    x, g = RNG.standard_normal((6, 9)), RNG.standard_normal((6, 9))
    h = hyper(0.5, flatten=False)
    xd = reference_dion2_step(x, np.zeros_like(x), g, h, SVD)[0]
    xm = reference_muon_step(x, np.zeros_like(x), g, MuonHyper(h.lr, h.ef_decay, False, h.weight_decay, False), SVD)[0]
    assert np.abs(xd - xm).max() > 1e-3


def test_error_feedback_only_on_selected_slices_and_weight_decay_everywhere():
    x, m, g = (RNG.standard_normal((4, 8)) for _ in range(3))
    new_x, new_m, _ = reference_dion2_step(x, m, g, hyper(0.25, flatten=False), SVD)
    changed = np.flatnonzero(np.any(new_m != m + g, axis=1))
    assert changed.size == 1 and np.allclose(new_m[changed], 0.9 * (m + g)[changed], rtol=1e-15, atol=0)
    rest = np.setdiff1d(np.arange(4), changed)
    assert np.array_equal(new_x[rest], x[rest] * (1 - 0.02 * 0.1))


def test_lr_scale_comes_from_the_full_view():
    """Negative control: the scale of the selected submatrix [k, n] is a different (wrong) step."""
    x, m, g = (RNG.standard_normal((8, 16)) for _ in range(3))
    h = hyper(0.25, flatten=False, wd=0.0)
    step = reference_dion2_step(x, m, g, h, SVD)[0] - x
    assert np.linalg.norm(step) == pytest.approx(h.lr * math.sqrt(8 / 16) * math.sqrt(2), rel=1e-12, abs=0)


def test_noflat_3d_selects_within_each_trailing_matrix():
    x, m, g = (RNG.standard_normal((3, 4, 6)) for _ in range(3))
    new_x = reference_dion2_step(x, m, g, hyper(0.25, flatten=False, wd=0.0), SVD)[0]
    assert [int(np.any(new_x[b] != x[b], axis=1).sum()) for b in range(3)] == [1, 1, 1]


def test_local_blocks_of_one_block_equal_the_global_step_and_others_do_not():
    x, m, g = (RNG.standard_normal((8, 12)) for _ in range(3))
    h = hyper(0.5, flatten=False)
    whole = reference_dion2_step(x, m, g, h, PE)
    one = reference_dion2_step(x, m, g, h, PE, blocks=[8])
    split = reference_dion2_step(x, m, g, h, PE, blocks=[3, 3, 2])
    assert np.array_equal(whole[0], one[0])
    assert np.abs(split[0] - whole[0]).max() > 1e-3


@pytest.mark.parametrize("flatten,shape", [(True, (8, 4, 3, 3)), (False, (8, 12)), (False, (3, 4, 6))])
def test_nordion2_fraction_one_is_normuon(flatten, shape):
    x = RNG.standard_normal(shape)
    h = NorDion2Hyper(lr=0.02, fraction=1.0, ef_decay=0.9, weight_decay=0.1, flatten=flatten)
    nh = NorMuonHyper(0.02, 0.9, False, 0.1, flatten)
    xd, md, vd = x, np.zeros(shape), initial_row_variance(shape, flatten)
    xn, mn, vn = x, np.zeros(shape), initial_variance(shape, flatten)
    for _ in range(3):
        g = RNG.standard_normal(shape)
        xd, md, vd, _ = reference_nordion2_step(xd, md, vd, g, h, PE)
        xn, mn, vn = reference_normuon_step(xn, mn, vn, g, nh, PE)
        assert np.allclose(xd, xn, rtol=0, atol=1e-14) and np.allclose(vd, vn, rtol=1e-13, atol=0)


def test_nordion2_selects_rows_of_a_tall_matrix_and_keeps_unselected_variance():
    shape = (12, 4)
    x, m, g = (RNG.standard_normal(shape) for _ in range(3))
    h = NorDion2Hyper(lr=0.02, fraction=0.25, ef_decay=0.9, weight_decay=0.0, flatten=False)
    new_x, _, v, _ = reference_nordion2_step(x, m, np.full((1, 12), 0.5), g, h, SVD)
    rows = np.flatnonzero(np.any(new_x != x, axis=1))
    assert rows.size == 3 and np.array_equal(rows, np.flatnonzero(v[0] != 0.5))
    o = polar_factor((m + g)[rows], 0.0)
    assert np.allclose(v[0, rows], 0.95 * 0.5 + 0.05 * np.mean(o * o, axis=1), rtol=1e-14, atol=0)


def test_nordion2_rejects_column_selection():
    with pytest.raises(ValueError, match="rows_only"):
        reference_nordion2_step(np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((1, 2)), np.zeros((2, 2)),
                                NorDion2Hyper(0.02, 0.5, 0.9, 0.0, False, rows_only=False), PE)


def test_fraction_out_of_range_is_rejected():
    for fraction in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="fraction"):
            hyper(fraction)


def test_nordion2_row_blocks_restore_each_blocks_norm():
    """Under Shard(0) each rank restores the norm of its own (selected) rows."""
    shape = (8, 12)
    x, m, g = (RNG.standard_normal(shape) for _ in range(3))
    h = NorDion2Hyper(lr=1.0, fraction=0.5, ef_decay=0.9, weight_decay=0.0, flatten=False)
    conv = Conventions(Orthogonalizer.named("svd", compute_dtype="fp64"), lr_scale="none", compute_dtype="fp64")
    v0 = np.full((1, 8), 0.01) * np.arange(1, 9)
    whole = x - reference_nordion2_step(x, m, v0, g, h, conv)[0]
    split = x - reference_nordion2_step(x, m, v0, g, h, conv, row_blocks=[3, 3, 2])[0]
    sel = np.any(split != 0, axis=1)
    o = np.zeros(shape)
    o[sel] = polar_factor((m + g)[sel], 0.0)
    for lo, hi in [(0, 3), (3, 6), (6, 8)]:
        assert np.linalg.norm(split[lo:hi]) == pytest.approx(np.linalg.norm(o[lo:hi]), rel=1e-13, abs=0)
    assert np.linalg.norm(whole) == pytest.approx(np.linalg.norm(o), rel=1e-13, abs=0)
    assert np.abs(whole - split).max() > 1e-3   # the blocks' restores differ from the whole's
