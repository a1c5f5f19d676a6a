"""Conventions that legitimately differ between Muon implementations.

A target's adapter declares these; the reference is built from them, so that a
convention difference is never reported as a bug and a bug is never hidden as a
convention (docs/design.md §3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from oracles.coefficients import Coefficients, newton_schulz_schedule, polar_express_schedule, POLAR_EXPRESS_SAFETY
from oracles.rounding import FORMATS, machine_epsilon
from oracles.spectral import Normaliser

ORTHOGONALIZERS = ("newton_schulz", "polar_express", "svd", "gram_newton_schulz", "none")
LR_SCALES = ("spectral_norm", "spectral_norm_clamped", "rms_norm", "none")
LR_DIMS = ("flattened", "last_two", "first_two")
MOMENTA = ("sum", "ema", "ema_debiased")
NESTEROVS = ("sum", "ema", "plus")
DECAY_MASKS = ("all", "cautious")
ROUNDINGS = ("nearest", "stochastic")
NORMUON_ROWS = ("matrix", "trailing")


@dataclass(frozen=True)
class Orthogonalizer:
    """What orth(U) computes.

    kind "polynomial": the iteration `schedule` from U / normaliser(U);
    kind "svd": the polar factor U V^T over singular values > rcond_factor*max(m,n)*s_max;
    kind "none": nothing is orthogonalized (an elementwise algorithm: AdamW).
    iteration: how a polynomial is evaluated, "standard" (on X) or "gram" (on X Xᵀ, restarted): the same
    map in exact arithmetic, a different rounding (the tolerance policy keys it apart).
    """

    kind: str
    schedule: tuple[Coefficients, ...] = ()
    normaliser: Normaliser = field(default_factory=Normaliser)
    rcond_factor: float = 0.0
    iteration: str = "standard"

    @classmethod
    def named(cls, name: str, *, steps: int | None = None, eps: float = 1e-7,
              normaliser_form: str = "plus", compute_dtype: str = "fp32") -> "Orthogonalizer":
        """The orthogonalizer a Muon option name stands for (5 steps by default). "gram_newton_schulz"
        (Muon's default schedule, Polar Express) iterates on X Xᵀ but equals the standard iteration in
        exact arithmetic: its reference is the spectral map of the same schedule."""
        steps = 5 if steps is None else steps
        if name == "newton_schulz":
            return cls("polynomial", tuple(newton_schulz_schedule(steps)), Normaliser(eps, 1.0, normaliser_form))
        if name in ("polar_express", "gram_newton_schulz"):
            return cls("polynomial", tuple(polar_express_schedule(steps)),
                       Normaliser(eps, POLAR_EXPRESS_SAFETY, normaliser_form),
                       iteration="gram" if name == "gram_newton_schulz" else "standard")
        if name == "svd":
            # SVD runs in at least fp32; its rank cut-off follows the LAPACK/numpy habit.
            fmt = "fp64" if compute_dtype == "fp64" else "fp32"
            return cls("svd", rcond_factor=machine_epsilon(fmt))
        if name == "none":
            return cls("none")
        raise ValueError(f"unknown orthogonalizer {name!r}; expected one of {ORTHOGONALIZERS}")

    @classmethod
    def polynomial(cls, schedule: Sequence[Coefficients], *, eps: float, scale: float = 1.0,
                   form: str = "plus") -> "Orthogonalizer":
        """Any coefficient schedule (one (a, b, c) per step) from U / normaliser(U), where the
        normaliser is `form` "plus": scale*||U||_F + eps, or "clamp": max(scale*||U||_F, eps)."""
        steps = tuple((float(a), float(b), float(c)) for a, b, c in schedule)
        if not steps:
            raise ValueError("Orthogonalizer.polynomial: the schedule has no step")
        return cls("polynomial", steps, Normaliser(eps, scale, form))


@dataclass(frozen=True)
class Conventions:
    """How one implementation does Muon.

    momentum:  "sum"  M <- mu M + G            | "ema"  M <- mu M + (1-mu) G
               | "ema_debiased" M <- b_t M + (1-b_t) G with b_t = 1 - (1-mu)/(1-mu^t) at step t,
                 i.e. the bias-corrected EMA  EMA_t / (1 - mu^t)
    nesterov:  "sum"  U = G + mu M             | "ema"  U = (1-mu) G + mu M  | "plus" U = G + M
    weight_decay_order: "before" X <- X(1-lr_wd wd) then the update | "after"
    weight_decay_lr:    "base" lr_wd = lr | "adjusted" lr_wd = lr * scale
    weight_decay_mask:  "all" | "cautious": decay only the entries where X and the update O have
               the same sign (X*O > 0; entries with X*O = 0 have measure zero for the harness's data)
    lr_scale:  "spectral_norm" sqrt(fan_out/fan_in) | "spectral_norm_clamped" sqrt(max(1, fan_out/fan_in))
               | "rms_norm" 0.2 sqrt(max(fan_out, fan_in)) | "none" 1
    lr_dims:   where (fan_out, fan_in) come from: "flattened" (shape[0], prod(shape[1:]))
               | "last_two" (shape[-2], shape[-1]) | "first_two" (shape[0], shape[1])
    compute_dtype: the format U is rounded to before orthogonalization.
    rounding:  how U is rounded to compute_dtype: "nearest" (even) | "stochastic": unbiased random
               rounding, whose expectation is U itself, so the reference uses U unrounded (the
               expectation) and the compute dtype's tolerance bounds the rounding noise
    state_dtype: the format the momentum buffer is stored in after every update ("fp64": exact)
    lr_dtype:  the format lr, the lr scale and their product are held in: the reference applies
               round(round(lr) * round(scale)) ("fp64": exact). An fp32 lr on fp64 parameters is
               a real, harmless imprecision (2e-8 relative) that this makes part of the reference.
    normuon_rows: the rows NorMuon normalises: "matrix" the rows of the orthogonalized matrix view,
               norm restored over the parameter | "trailing" the rows of every trailing 2-D slice
               [shape[-2], shape[-1]] of the parameter, norm restored per slice
    adam_eps:  AdamW's eps, added to sqrt of the bias-corrected second moment (oracles/adamw_reference.py)
    decay_dtype: where weight decay joins the step: "fp64" applied to the parameter on its own,
               X (1 - lr_wd wd) (exact in the reference) | a format: folded into the orthogonalized
               update, which is held in that format, X <- X - lr scale round(O + (lr_wd / (lr scale)) wd X)
               (the mask applies to the decay term; "before" order only). The decay term is then
               rounded with O to that format (bf16: 2^-9 of |O + wd X| relative) before it reaches the
               parameter: a real, harmless imprecision that this makes part of the reference.
    """

    orthogonalizer: Orthogonalizer
    momentum: str = "sum"
    nesterov: str = "sum"
    weight_decay_order: str = "before"
    weight_decay_lr: str = "base"
    lr_scale: str = "spectral_norm"
    lr_dims: str = "flattened"
    compute_dtype: str = "fp32"
    weight_decay_mask: str = "all"
    rounding: str = "nearest"
    state_dtype: str = "fp64"
    lr_dtype: str = "fp64"
    normuon_rows: str = "matrix"
    decay_dtype: str = "fp64"
    adam_eps: float = 1e-8

    def __post_init__(self) -> None:
        choices = {"momentum": MOMENTA, "nesterov": NESTEROVS,
                   "weight_decay_order": ("before", "after"), "weight_decay_lr": ("base", "adjusted"),
                   "lr_scale": LR_SCALES, "lr_dims": LR_DIMS, "compute_dtype": FORMATS,
                   "weight_decay_mask": DECAY_MASKS, "rounding": ROUNDINGS, "state_dtype": FORMATS,
                   "lr_dtype": FORMATS, "normuon_rows": NORMUON_ROWS, "decay_dtype": FORMATS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"Conventions.{name}={getattr(self, name)!r}; expected one of {allowed}")
        if self.decay_dtype != "fp64" and self.weight_decay_order != "before":
            raise ValueError(f"Conventions.decay_dtype={self.decay_dtype!r} folds decay into the update, which "
                             f"decays the parameter before it (weight_decay_order 'before', not "
                             f"{self.weight_decay_order!r})")

    def held_formats(self) -> str:
        """What the target holds in a format coarser than fp64 and the reference therefore rounds too
        (a real, harmless imprecision of the target, not a failure), or "" if nothing."""
        held = [f"{what} in {fmt}" for what, fmt in (("lr", self.lr_dtype), ("momentum", self.state_dtype))
                if fmt != "fp64"]
        if self.decay_dtype != "fp64":
            held.append(f"the decay term in {self.decay_dtype}, folded into the update")
        if self.rounding == "stochastic":
            held.append(f"U stochastically rounded to {self.compute_dtype} (reference: its expectation)")
        return ("the target holds " + ", ".join(held) + "; the reference does the same") if held else ""


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
