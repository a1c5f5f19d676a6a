"""Dion2's tensor pieces (optimizers/algorithms/dion2.py) against the oracle's selection rule."""

import numpy as np
import pytest
import torch

from optimizers.algorithms.dion2 import (FP64_NORM_SCALE, descending, error_feedback, gather_selected,
                                         reduced_dims, scatter_selected, select_count, selects_rows, slice_norms,
                                         top_k_mask)
from oracles import select

GEN = torch.Generator().manual_seed(7)


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5, 1.0])
def test_top_k_mask_is_the_oracle_selection_ties_included(fraction):
    norms = torch.randint(0, 4, (5, 13), generator=GEN).double()  # many ties
    mask = top_k_mask(norms, fraction)
    for b in range(5):
        want, _ = select(norms[b].numpy(), fraction)
        assert torch.nonzero(mask[b]).flatten().tolist() == want.tolist()


def test_top_k_mask_groups_select_per_group_like_the_oracle_blocks():
    norms = torch.tensor([[9.0, 8.0, 7.0, 1.0, 2.0, 3.0, 5.0]])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    got = torch.nonzero(top_k_mask(norms, 0.3, groups)[0]).flatten().tolist()
    assert got == select(norms[0].numpy(), 0.3, [3, 3, 1])[0].tolist() == [0, 5, 6]


def test_select_count():
    assert [select_count(n, 0.25) for n in (0, 1, 4, 5, 12)] == [0, 1, 1, 2, 3]


def test_slices_of_a_flattened_conv_are_output_channels_or_columns():
    m = torch.randn(8, 4, 3, 3, generator=GEN)
    assert selects_rows((8, 4, 3, 3), True, False) and not selects_rows((40, 2, 2, 2), True, False)
    flat = m.reshape(8, -1).double()  # the norms are fp64 sums (of an fp64 m: times FP64_NORM_SCALE)
    assert torch.allclose(slice_norms(m, reduced_dims(4, True, True)).flatten(), flat.abs().sum(1))
    assert torch.allclose(slice_norms(m, reduced_dims(4, True, False)).flatten(), flat.abs().sum(0))
    assert torch.allclose(slice_norms(m.double(), reduced_dims(4, True, True)).flatten(),
                          flat.abs().sum(1) * FP64_NORM_SCALE)
    assert slice_norms(m, reduced_dims(4, False, True)).shape == (8, 4, 3, 1)  # unflattened: kernel rows


def test_error_feedback_touches_only_the_selected_slices_with_the_scalar_product():
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        m = torch.randn(6, 5, generator=GEN).to(dtype)
        mask = torch.tensor([True, False, True, False, False, False]).reshape(6, 1)
        want = m.clone()
        want[[0, 2]] = want[[0, 2]] * 0.95
        error_feedback(m, mask, 0.95)
        assert torch.equal(m, want)


def test_gather_then_scatter_places_the_nonzero_slices_back():
    mats = torch.randn(3, 4, 7, generator=GEN, dtype=torch.float64)
    mats[:, [1, 3]] = 0.0
    mats[2, 0] = 0.0                                 # a matrix with fewer selected slices
    sub, idx = gather_selected(mats, rows=True)
    assert sub.shape == (3, 2, 7) and idx[0].tolist() == [0, 2] and idx[2].tolist() == [0, 2]
    assert torch.equal(scatter_selected(sub, idx, mats, rows=True), mats)
    cols = mats.mT.contiguous()
    sub, idx = gather_selected(cols, rows=False)
    assert sub.shape == (3, 7, 2) and torch.equal(scatter_selected(sub, idx, cols, rows=False), cols)


def test_top_k_mask_groups_per_matrix_row():
    """Groups that differ between matrices (a sharded batch dim) select within each matrix's group."""
    norms = torch.tensor([[1.0, 4.0, 3.0, 2.0], [5.0, 6.0, 7.0, 8.0]])
    groups = torch.tensor([[0, 0, 1, 1], [2, 2, 2, 2]])
    got = top_k_mask(norms, 0.5, groups)
    assert got.tolist() == [[False, True, True, False], [False, False, True, True]]


def test_select_count_in_groups_matches_python_arithmetic():
    """ceil(0.1 * 10) is 1 in Python (float64); float32 arithmetic would make it 2."""
    norms = torch.arange(10, dtype=torch.float32).unsqueeze(0)
    assert int(top_k_mask(norms, 0.1, torch.zeros(10, dtype=torch.long)).sum()) == select_count(10, 0.1) == 1


def test_ties_rank_by_index_in_rows_long_enough_for_an_unstable_sort():
    """Ties to the lower index (the oracle's rule) in rows of 64 with many ties, where torch's CPU sort without
    `stable` orders equal values otherwise (a `stable=False` mutant passed the 13-wide rows above)."""
    norms = torch.randint(0, 3, (4, 64), generator=torch.Generator().manual_seed(3)).double()
    want = torch.from_numpy(np.argsort(-norms.numpy(), axis=-1, kind="stable"))
    assert torch.equal(descending(norms), want)


@pytest.mark.parametrize("ndim, rows, want", [(2, False, (0,)), (3, False, (1,)), (4, False, (2,)), (5, False, (3,)),
                                              (4, True, (3,))])
def test_unflattened_slices_sum_over_the_matrix_dims(ndim, rows, want):
    """Without flatten a parameter is a stack of its last two dims' matrices: a row slice sums over the last dim,
    a column slice over the one before it, whatever the rank (no CI case selects the columns of a tall
    unflattened conv kernel, where `ndim % 2`, `ndim >> 2` and `ndim ^ 2` for `ndim - 2` survived)."""
    assert reduced_dims(ndim, False, rows) == want


def test_fp64_slices_near_the_top_of_the_range_keep_their_order():
    """fp64 slices summed after scaling by FP64_NORM_SCALE, a power of two: two slices of entries near 1e308, whose
    L1 sums overflow unscaled, keep their order (unscaled or scaled up, both sums are inf and the tie goes to the
    lower index), and slices one ulp apart keep theirs (a scale of 3^-64 rounds some such pairs together)."""
    big = torch.tensor([[1.0e308, 1.0e308], [1.5e308, 1.5e308]], dtype=torch.float64)
    norms = slice_norms(big, (1,))
    assert bool(torch.isfinite(norms).all()) and descending(norms.reshape(1, -1)).tolist() == [[1, 0]]
    base = torch.rand(64, generator=torch.Generator().manual_seed(4), dtype=torch.float64) + 0.5
    pairs = torch.stack([base, torch.nextafter(base, torch.tensor(2.0, dtype=torch.float64))], dim=1)
    scaled = slice_norms(pairs.reshape(64, 2, 1), (2,)).reshape(64, 2)
    assert bool((scaled[:, 1] > scaled[:, 0]).all())
