"""Conventions that legitimately differ between Muon implementations.

A target's adapter declares these; the reference is built from them, so that a
convention difference is never reported as a bug and a bug is never hidden as a
convention (docs/design.md §3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from oracles.coefficients import Coefficients, newton_schulz_schedule, polar_express_schedule, POLAR_EXPRESS_SAFETY
from oracles.rounding import FORMATS, machine_epsilon
from oracles.spectral import Normaliser

ORTHOGONALIZERS = ("newton_schulz", "polar_express", "svd")
LR_SCALES = ("spectral_norm", "spectral_norm_clamped", "rms_norm", "none")
LR_DIMS = ("flattened", "last_two", "first_two")


@dataclass(frozen=True)
class Orthogonalizer:
    """What orth(U) computes.

    kind "polynomial": the iteration `schedule` from U / normaliser(U);
    kind "svd": the polar factor U V^T over singular values > rcond_factor*max(m,n)*s_max.
    """

    kind: str
    schedule: tuple[Coefficients, ...] = ()
    normaliser: Normaliser = field(default_factory=Normaliser)
    rcond_factor: float = 0.0

    @classmethod
    def named(cls, name: str, *, steps: int | None = None, eps: float = 1e-7,
              normaliser_form: str = "plus", compute_dtype: str = "fp32") -> "Orthogonalizer":
        """The orthogonalizer a Muon option name stands for (5 steps by default)."""
        steps = 5 if steps is None else steps
        if name == "newton_schulz":
            return cls("polynomial", tuple(newton_schulz_schedule(steps)), Normaliser(eps, 1.0, normaliser_form))
        if name == "polar_express":
            return cls("polynomial", tuple(polar_express_schedule(steps)),
                       Normaliser(eps, POLAR_EXPRESS_SAFETY, normaliser_form))
        if name == "svd":
            # SVD runs in at least fp32; its rank cut-off follows the LAPACK/numpy habit.
            fmt = "fp64" if compute_dtype == "fp64" else "fp32"
            return cls("svd", rcond_factor=machine_epsilon(fmt))
        raise ValueError(f"unknown orthogonalizer {name!r}; expected one of {ORTHOGONALIZERS}")


@dataclass(frozen=True)
class Conventions:
    """How one implementation does Muon.

    momentum:  "sum"  M <- mu M + G            | "ema"  M <- mu M + (1-mu) G
    nesterov:  "sum"  U = G + mu M             | "ema"  U = (1-mu) G + mu M
    weight_decay_order: "before" X <- X(1-lr_wd wd) then the update | "after"
    weight_decay_lr:    "base" lr_wd = lr | "adjusted" lr_wd = lr * scale
    lr_scale:  "spectral_norm" sqrt(fan_out/fan_in) | "spectral_norm_clamped" sqrt(max(1, fan_out/fan_in))
               | "rms_norm" 0.2 sqrt(max(fan_out, fan_in)) | "none" 1
    lr_dims:   where (fan_out, fan_in) come from: "flattened" (shape[0], prod(shape[1:]))
               | "last_two" (shape[-2], shape[-1]) | "first_two" (shape[0], shape[1])
    compute_dtype: the format U is rounded to before orthogonalization.
    """

    orthogonalizer: Orthogonalizer
    momentum: str = "sum"
    nesterov: str = "sum"
    weight_decay_order: str = "before"
    weight_decay_lr: str = "base"
    lr_scale: str = "spectral_norm"
    lr_dims: str = "flattened"
    compute_dtype: str = "fp32"

    def __post_init__(self) -> None:
        choices = {"momentum": ("sum", "ema"), "nesterov": ("sum", "ema"),
                   "weight_decay_order": ("before", "after"), "weight_decay_lr": ("base", "adjusted"),
                   "lr_scale": LR_SCALES, "lr_dims": LR_DIMS, "compute_dtype": FORMATS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"Conventions.{name}={getattr(self, name)!r}; expected one of {allowed}")


def fans(shape: tuple[int, ...], dims: str) -> tuple[int, int]:
    """(fan_out, fan_in) of a parameter shape under a `lr_dims` convention."""
    if dims == "flattened":
        return shape[0], math.prod(shape[1:])
    if dims == "last_two":
        return shape[-2], shape[-1]
    return shape[0], shape[1]


def lr_scale(shape: tuple[int, ...], formula: str, dims: str) -> float:
    """The multiplier on lr for a parameter of `shape`."""
    fan_out, fan_in = fans(shape, dims)
    if formula == "spectral_norm":
        return math.sqrt(fan_out / fan_in)
    if formula == "spectral_norm_clamped":
        return math.sqrt(max(1.0, fan_out / fan_in))
    if formula == "rms_norm":
        return 0.2 * math.sqrt(max(fan_out, fan_in))
    return 1.0
