"""Adapter for PyTorch's built-in `torch.optim.Muon` (torch 2.13), conventions as it defines them.

What its source does (torch/optim/_muon.py):
  - 2-D parameters only; Keller Jordan's quintic with fixed coefficients (no per-step schedule, no SVD).
  - momentum as an EMA: B <- mu B + (1 - mu) G; Nesterov U = (1 - mu) G + mu B (`grad.lerp(buf, mu)`).
  - always orthogonalizes in bf16; normaliser X / max(||X||_F, eps).
  - lr scale from shape[:2]: "original" sqrt(max(1, A/B)), "match_rms_adamw" 0.2 sqrt(max(A, B)).
  - decoupled weight decay X(1 - lr wd) with the unadjusted lr, before the update.
Its docstring states the sum form B <- mu B + g; the code uses the EMA form. The two
differ only by a factor (1 - mu) that the normaliser removes, up to eps.
"""

from __future__ import annotations

import types
from typing import Any, Mapping

import torch

from cases import Case
from cases.axes import EXTREME_GRADIENT
from harness.targets.base import OptimizerTarget
from oracles import Conventions, Orthogonalizer

_ADJUST = types.MappingProxyType(
    {"spectral_norm": ("original", "spectral_norm_clamped"), "rms_norm": ("match_rms_adamw", "rms_norm")})
"""case adjust_lr -> (torch's adjust_lr_fn, the formula it computes)."""


class TorchMuon(OptimizerTarget):
    name = "torch"
    exact_relations = True

    def version(self) -> str:
        return f"torch.optim.Muon (torch {torch.__version__})"

    def unsupported(self, case: Case) -> str | None:
        if case.optimizer != "muon":
            return f"torch.optim.Muon implements Muon only (case: {case.optimizer})"
        if len(case.shape) != 2:
            return f"torch.optim.Muon supports 2-D parameters only (shape {case.shape_text})"
        if case.orthogonalizer != "newton_schulz":
            return f"torch.optim.Muon has only fixed-coefficient Newton-Schulz (case: {case.orthogonalizer})"
        if case.compute_dtype != "bf16":
            return f"torch.optim.Muon always orthogonalizes in bf16 (case: {case.compute_dtype})"
        if case.adjust_lr not in _ADJUST:
            return "torch.optim.Muon has no unscaled learning-rate mode"
        return None

    def conventions(self, case: Case) -> Conventions:
        return Conventions(
            orthogonalizer=Orthogonalizer.named("newton_schulz", normaliser_form="clamp"),
            momentum="ema", nesterov="ema", lr_scale=_ADJUST[case.adjust_lr][1], lr_dims="first_two",
            compute_dtype="bf16")

    def defaults(self, optimizer: str) -> Mapping[str, Any] | None:
        """torch.optim.Muon's documented defaults: momentum 0.95, Nesterov, weight decay 0.1, adjust_lr_fn None
        (the "original" scale), Keller's quintic in bf16 on 2-D parameters."""
        if optimizer != "muon":
            return None
        return dict(momentum=0.95, nesterov=True, weight_decay=0.1, adjust_lr="spectral_norm",
                    orthogonalizer="newton_schulz", compute_dtype="bf16")

    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        if case.construct == "defaults":
            return torch.optim.Muon(params, lr=case.lr)
        return torch.optim.Muon(params, lr=case.lr, momentum=case.momentum, nesterov=case.nesterov,
                                weight_decay=case.weight_decay, adjust_lr_fn=_ADJUST[case.adjust_lr][0])


def bf16_buffer_finding(case: Case) -> str | None:
    """Where torch.optim.Muon is not correct: it overwrites a bf16 momentum buffer in place without Nesterov
    (README, Findings)."""
    if case.param_dtype == "bf16" and not case.nesterov and case.steps > 1:
        return "torch.optim.Muon overwrites a bf16 momentum buffer in place without Nesterov (README, Findings)"
    return None


def range_finding(case: Case) -> str | None:
    """Where torch.optim.Muon is not correct either: near the format's range its normaliser overflows and the
    update vanishes (docs/findings.md); non-finite gradients it takes as they come."""
    if case.grad == EXTREME_GRADIENT:
        return "torch.optim.Muon's normaliser overflows near the format's range: its update vanishes (docs/findings.md)"
    return None


def findings(case: Case) -> str | None:
    """Every known defect of torch.optim.Muon at `case`, or None."""
    return bf16_buffer_finding(case) or range_finding(case)


def target() -> TorchMuon:
    return TorchMuon()
