"""Our optimizer declaring other arithmetic than its case's: another compute dtype (DeclaredCompute), another
schedule (DeclaredSchedule). What a correct implementation declaring that computes, for the calibrators."""

from __future__ import annotations

import dataclasses
import functools
import types

import torch

from cases import Case
from harness.policy import keys
from harness.running.inputs import TORCH_DTYPES
from harness.targets.ours import OursMuon
from optimizers import REGISTRY
from optimizers import gram_newton_schulz as gram
from optimizers.algorithms.base import Group
from optimizers.algorithms.muon import default_compute_dtype
from oracles import Conventions, Orthogonalizer

VARIANTS = types.MappingProxyType(
    {("fp64", "fp32"): ("bf16", "fp16"), ("fp32", "bf16"): ("fp16",), ("bf16", "bf16"): ("fp16",)})
"""(param, compute) of a tier case -> the other compute formats its polynomial cases are also run in."""


class DeclaredCompute(OursMuon):
    """optimizers.Muon with its compute dtype (and the declared one) replaced by `compute`."""

    def __init__(self, compute: str) -> None:
        self.compute = compute

    def conventions(self, case: Case) -> Conventions:
        conv = super().conventions(case)
        return Conventions(**{**conv.__dict__, "compute_dtype": self.compute})

    def options(self, case: Case) -> dict:
        return {**super().options(case), "compute_dtype": TORCH_DTYPES[self.compute]}


def declared_polynomial(coefficients: tuple, scale: float, mats: torch.Tensor, group: Group) -> torch.Tensor:
    """Muon's orthogonalize stage running `coefficients` from X / (scale ||X||_F + eps) in the group's compute
    dtype: the Gram iteration (our restarts) for a Gram group; else the standard one on the wide orientation,
    evaluated op by op as the peers write it, A = X X^T, B = bA + cA^2, X = aX + BX, each product and sum
    rounded (our optimizer fuses them into fewer roundings: with You's quintics on rank-1 fp32@bf16 steps
    the fused form measured a worst c of 0.38 where dion needed 1.35, this form 1.35)."""
    compute = group["compute_dtype"] or default_compute_dtype(mats.device)
    if group["orthogonalizer"] == "gram_newton_schulz":
        return gram.gram_newton_schulz(mats, coefficients, scale, group["eps"], compute,
                                       tuple(group["gram_restarts"]))
    x = mats.to(compute)
    tall = x.size(-2) > x.size(-1)
    x = x.mT if tall else x
    x = x / (torch.linalg.matrix_norm(x, ord="fro", keepdim=True) * scale + group["eps"])
    for a, b, c in coefficients:
        products = x @ x.mT
        x = a * x + (b * products + c * (products @ products)) @ x
    return (x.mT if tall else x).to(mats.dtype)


MEASURABLE = types.MappingProxyType({**keys.OWN_SCHEDULES, **keys.SCHEDULES})
"""Schedules --schedules takes: the named peer schedules, and ours by option name (on a Gram case,
"newton_schulz" is Keller Jordan's quintic under the Gram iteration, which our tiers' Gram cases do not run)."""


class DeclaredSchedule(OursMuon):
    """optimizers.Muon (any of its algorithms) with its polynomial replaced by schedule `name` of
    MEASURABLE, declared as such: what a correct peer declaring that schedule computes."""

    def __init__(self, name: str, eps: float | None = None) -> None:
        if name not in MEASURABLE:
            raise ValueError(f"unknown schedule {name!r}; expected one of {sorted(MEASURABLE)}")
        self.schedule = name
        self.eps = eps
        """The normaliser's eps (None: ours'): a peer's own (dion's 1e-8) where it matters, tiny gradients."""

    def conventions(self, case: Case) -> Conventions:
        conv = super().conventions(case)
        coefficients, scale = MEASURABLE[self.schedule]
        eps = conv.orthogonalizer.normaliser.eps if self.eps is None else self.eps
        orth = Orthogonalizer.polynomial(coefficients, eps=eps, scale=scale)
        return dataclasses.replace(conv, orthogonalizer=dataclasses.replace(
            orth, iteration=conv.orthogonalizer.iteration))

    def options(self, case: Case) -> dict:
        options = super().options(case)
        coefficients, scale = MEASURABLE[self.schedule]
        stage = functools.partial(declared_polynomial, tuple(coefficients), scale)
        eps = {} if self.eps is None else {"eps": self.eps}
        return {**options, **eps,
                "algorithm": dataclasses.replace(REGISTRY[options["algorithm"]], orthogonalize=stage)}
