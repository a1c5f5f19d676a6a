"""Negative controls: deliberately wrong Muons that the harness must flag.

Each reproduces a bug seen in public implementations, as our algorithm record with one stage
replaced (optimizers/algorithms/base.py). They exist so that tests can prove each check fails
when it should (tests/test_controls.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import torch

from cases import Case
from harness.targets.ours import OursMuon
from optimizers import REGISTRY, Algorithm
from optimizers.algorithms.base import Group, State, StateKey
from optimizers.algorithms.normuon import normalise_rows, row_normalise, variance_shape
from optimizers.coefficients import normaliser_scale, schedule
from optimizers.distributed import local
from optimizers.matrix_view import lr_scale

Variant = Callable[[Algorithm], Algorithm]


class Control(OursMuon):
    """Our adapter (same declared conventions) around a broken variant of the case's algorithm:
    `variant` maps the case's registered record to the broken one."""

    exact_relations = True

    def __init__(self, name: str, variant: Variant) -> None:
        self.name = name
        self.variant = variant

    def options(self, case: Case) -> dict[str, Any]:
        options = super().options(case)
        return {**options, "algorithm": self.variant(REGISTRY[options["algorithm"]])}


def _mixing_layers(orthogonalize: Any, mats: torch.Tensor, group: Group) -> torch.Tensor:
    """flatten=True megabatch [N, out, prod(rest)] reshaped to one [N, numel] matrix: orthogonalizes
    across layers."""
    if not (group["flatten"] and mats.shape[0] > 1):
        return orthogonalize(mats, group)
    return orthogonalize(mats.reshape(1, mats.shape[0], -1), group).reshape(mats.shape)


def _last_two_dims_lr(shape: tuple[int, ...], group: Group) -> float:
    """lr scale read from the last two dims (e.g. kh, kw of a conv) instead of the flattened matrix."""
    return lr_scale(shape[-2:], False, group["adjust_lr"])


def _stack_norm(orthogonalize: Any, mats: torch.Tensor, group: Group) -> torch.Tensor:
    """Normalises the whole megabatch by one Frobenius norm (`x.norm()` without dims) before Newton-Schulz."""
    if group["orthogonalizer"] == "svd":
        return orthogonalize(mats, group)
    x = mats.float()
    tall = x.size(-2) > x.size(-1)
    x = x.mT if tall else x
    x = x / (x.norm() * normaliser_scale(group["orthogonalizer"]) + group["eps"])
    for a, b, c in schedule(group["orthogonalizer"], group["ns_steps"] or 5):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.mT if tall else x).to(mats.dtype)


def _with_orthogonalize(broken: Any) -> Variant:
    def variant(algorithm: Algorithm) -> Algorithm:
        return dataclasses.replace(algorithm, orthogonalize=functools.partial(broken, algorithm.orthogonalize))
    return variant


def layer_mixing() -> Control:
    return Control("control-layer-mixing", _with_orthogonalize(_mixing_layers))


def lr_last_two_dims() -> Control:
    return Control("control-lr-last-two-dims", lambda algorithm: dataclasses.replace(algorithm,
                                                                                     lr_scale=_last_two_dims_lr))


def stack_norm() -> Control:
    return Control("control-stack-norm", _with_orthogonalize(_stack_norm))


def _kernel_slice_shape(shape: tuple[int, ...], group: Group) -> tuple[int, ...]:
    """param[..., 0:1]: with flatten, one value per kernel slice [out, in, kh], not per output channel."""
    return variance_shape(shape, False)


def _kernel_slice_rows(updates: torch.Tensor, states: list[State], group: Group) -> torch.Tensor:
    return normalise_rows(updates, [local(s["variance"]) for s in states], {**group, "flatten": False})


def _trailing_dims_shape(shape: tuple[int, ...], group: Group) -> tuple[int, ...]:
    """One value per [out, in] pair of a 3-D+ parameter."""
    return (shape[0], shape[1], 1) if len(shape) >= 3 else variance_shape(shape, group["flatten"])


def _trailing_dims_rows(updates: torch.Tensor, states: list[State], group: Group) -> torch.Tensor:
    """Row statistics over the unflattened trailing dims (averaged over the kernel) while the
    flattened matrix was orthogonalized."""
    if updates.ndim < 4:
        return row_normalise(updates, states, group)
    n, out, rest = updates.shape[0], updates.shape[1], updates.shape[2:]
    lead = updates.reshape(n, out, rest[0], -1)  # [N, out, in, prod(kernel)]: one "row" per (out, in)
    variances = [local(s["variance"]) for s in states]
    return normalise_rows(lead, variances, {**group, "flatten": False}).reshape(updates.shape)


def _normuon_variance(shape: Callable[[tuple[int, ...], Group], tuple[int, ...]], postprocess: Any) -> Variant:
    """NorMuon with its variance shape and row normalisation replaced; other algorithms unchanged."""
    def variant(algorithm: Algorithm) -> Algorithm:
        if algorithm.name != "normuon":
            return algorithm
        state = tuple(StateKey(k.name, shape, k.nonnegative) if k.name == "variance" else k for k in algorithm.state)
        return dataclasses.replace(algorithm, state=state, postprocess=postprocess)
    return variant


def normuon_kernel_slice_variance() -> Control:
    return Control("control-normuon-kernel-slice", _normuon_variance(_kernel_slice_shape, _kernel_slice_rows))


def normuon_trailing_dims_variance() -> Control:
    return Control("control-normuon-trailing-dims", _normuon_variance(_trailing_dims_shape, _trailing_dims_rows))
