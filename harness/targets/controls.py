"""Negative controls: deliberately wrong Muons that the harness must flag.

Each reproduces a bug seen in public implementations. They exist so that tests
can prove each check fails when it should (tests/test_controls.py).
"""

from __future__ import annotations

from typing import Any

import torch

import optimizers
from cases import Case
from harness.targets.ours import OursMuon
from optimizers.coefficients import normaliser_scale, schedule
from optimizers.matrix_view import as_matrices, lr_scale
from optimizers.distributed import local
from optimizers.normuon import normalise_rows


class _LayerMixingMuon(optimizers.Muon):
    """flatten=True megabatch [N, out, *rest] reshaped to one [N, numel] matrix: orthogonalizes across layers."""

    def _orthogonalized(self, stack: torch.Tensor, group: dict[str, Any], device: torch.device) -> torch.Tensor:
        if not (group["flatten"] and stack.shape[0] > 1):
            return super()._orthogonalized(stack, group, device)
        mixed = stack.reshape(1, stack.shape[0], -1)  # one matrix whose rows are whole layers
        return super()._orthogonalized(mixed, group, device).reshape(stack.shape)


class _LastTwoDimsLrMuon(optimizers.Muon):
    """lr scale read from the last two dims (e.g. kh, kw of a conv) instead of the flattened matrix."""

    def _lr_scale(self, shape: tuple[int, ...], group: dict[str, Any]) -> float:
        return lr_scale(shape[-2:], False, group["adjust_lr"])


class _StackNormMuon(optimizers.Muon):
    """Normalises the whole megabatch by one Frobenius norm (`x.norm()` without dims) before Newton-Schulz."""

    def _orthogonalized(self, stack: torch.Tensor, group: dict[str, Any], device: torch.device) -> torch.Tensor:
        if group["orthogonalizer"] == "svd":
            return super()._orthogonalized(stack, group, device)
        x = as_matrices(stack, group["flatten"]).float()
        tall = x.size(-2) > x.size(-1)
        x = x.mT if tall else x
        x = x / (x.norm() * normaliser_scale(group["orthogonalizer"]) + group["eps"])
        for a, b, c in schedule(group["orthogonalizer"], group["ns_steps"] or 5):
            gram = x @ x.mT
            x = a * x + (b * gram + c * gram @ gram) @ x
        return (x.mT if tall else x).to(stack.dtype).reshape(stack.shape)


class Control(OursMuon):
    """Our adapter (same declared conventions) around a broken optimizer class."""

    exact_relations = True

    def __init__(self, name: str, optimizer_class: type[optimizers.Muon]) -> None:
        self.name = name
        self.optimizer_class = optimizer_class

    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        return self.optimizer_class(params, **self.options(case))


def layer_mixing() -> Control:
    return Control("control-layer-mixing", _LayerMixingMuon)


def lr_last_two_dims() -> Control:
    return Control("control-lr-last-two-dims", _LastTwoDimsLrMuon)


def stack_norm() -> Control:
    return Control("control-stack-norm", _StackNormMuon)


class _KernelSliceVarianceNorMuon(optimizers.Muon):
    """NorMuon whose variance buffer is shaped param[..., 0:1]: with flatten, a conv's rows are
    normalised per kernel slice [out, in, kh] instead of per output channel."""

    def _postprocess(self, updates: torch.Tensor, params: list[torch.Tensor], group: dict[str, Any]) -> torch.Tensor:
        if group["algorithm"] != "normuon" or updates.ndim < 4:
            return super()._postprocess(updates, params, group)
        variances = [self.state[p].setdefault("variance", torch.zeros_like(local(p)[..., 0:1])) for p in params]
        return normalise_rows(updates, variances, {**group, "flatten": False})


class _TrailingDimsVarianceNorMuon(optimizers.Muon):
    """NorMuon that takes row statistics over the unflattened trailing dims (one value per
    [out, in] pair, averaged over the kernel) while orthogonalizing the flattened matrix."""

    def _postprocess(self, updates: torch.Tensor, params: list[torch.Tensor], group: dict[str, Any]) -> torch.Tensor:
        if group["algorithm"] != "normuon" or updates.ndim < 4:
            return super()._postprocess(updates, params, group)
        n, out, rest = updates.shape[0], updates.shape[1], updates.shape[2:]
        lead = updates.reshape(n, out, rest[0], -1)  # [N, out, in, prod(kernel)]: one "row" per (out, in)
        variances = [self.state[p].setdefault("variance_trailing", torch.zeros(out, rest[0], 1, dtype=updates.dtype))
                     for p in params]
        out_rows = normalise_rows(lead, variances, {**group, "flatten": False})
        return out_rows.reshape(updates.shape)


def normuon_kernel_slice_variance() -> Control:
    return Control("control-normuon-kernel-slice", _KernelSliceVarianceNorMuon)


def normuon_trailing_dims_variance() -> Control:
    return Control("control-normuon-trailing-dims", _TrailingDimsVarianceNorMuon)
