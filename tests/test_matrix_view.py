"""optimizers/matrix_view.py: the contracts its callers rely on that no case can see (found by mutation runs:
each of these mutants passed every case that reached it)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from optimizers.matrix_view import View, as_matrices, matrix_dims


def test_a_view_is_immutable_and_hashable():
    """A group's view is fixed once the plan is made (`frozen=False` survived every case)."""
    view = View(flatten=True, num_heads=4)
    assert hash(view) == hash(View(flatten=True, num_heads=4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.flatten = False  # type: ignore[misc]


@pytest.mark.parametrize("shape", [(12,), (3, 4)])
def test_a_stack_of_fewer_than_three_dims_is_refused_naming_its_shape(shape):
    """A stack is [N, *shape] of 2+-dim parameters: a 2-D one is a stack of vectors (`ndim < 2` survived)."""
    with pytest.raises(ValueError, match=r"2\+ dims, got shape \(" + ", ".join(map(str, shape))):
        as_matrices(torch.zeros(shape), flatten=False)


def test_head_dims_are_integers():
    """(fan_out, fan_in) of one head block are ints, as every other view's are (`/` survived: 3.0 compares equal
    to 3 but is no size)."""
    dims = matrix_dims((12, 20), False, 4)
    assert dims == (3, 20) and all(type(d) is int for d in dims)
    assert all(type(d) is int for d in matrix_dims((8, 4, 3, 3), True)) and matrix_dims((8, 4, 3, 3), True) == (8, 36)
