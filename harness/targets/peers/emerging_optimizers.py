"""NVIDIA's emerging-optimizers Muon (`emerging_optimizers.orthogonalized_optimizers.Muon`).

It needs Python >= 3.12 (it imports `typing.override`) and imports triton at import time (its
`triton_kernels`, which the package does not declare as a dependency; the extra installs it). Where
it cannot be imported, every case is `unsupported` with the import error and the reason.

What its source does (emerging-optimizers 0.3.0: orthogonalized_optimizer.py, muon.py,
muon_utils.py, mixin.py):
  - decoupled weight decay first, X <- X(1 - lr wd) with the base lr (`p.add_(p, alpha=-wd*lr)`),
    before the momentum and the update.
  - momentum as an EMA by lerp: M <- M + (1-mu)(G - M) = mu M + (1-mu) G; Nesterov (off by default)
    U = G.lerp(M, mu) = (1-mu) G + mu M; without it U = M. The buffer is `zeros_like(p)`. (This
    pair is the sum form M <- mu M + G, U = G + mu M, times 1-mu, which the normaliser removes.)
  - `newton_schulz` accepts fp32 input only (TypeError otherwise): fp32 parameters only.
    X0 = U / max(||U||_F, 1e-7) (`F.normalize`, a clamp) in fp32, computed on U^T when rows > cols
    (the same polynomial in exact arithmetic). Under `fp32_matmul_prec="medium"` (its default) X0
    is cast to bf16 and every step runs in bf16, on every device: compute dtype bf16. Under
    "highest" the steps run in fp32 (no TF32). "high" (TF32 matmuls on CUDA) is not run: no case
    declares that arithmetic.
  - coefficients: "quintic" (default, Jiacheng You's five quintics, judged for the Newton-Schulz
    cases), "simple" (Keller Jordan's quintic), "polar_express" (Polar Express with its 1.01 safety
    folded into the coefficients, rounded to 4 decimals, and NO safety factor in the normaliser),
    "cans", "aol", "deepseekv4", "custom". 5 steps. Without the normaliser safety a rank-1 direction
    enters at s = 1 exactly, where the composite polynomial oscillates fast (it stays in Polar
    Express's band, 0.85-1.12 over [1e-3, 1]) and amplifies rounding: A = 831 at s = 1 against 73 at
    s = 1/1.01 (harness/policy/sensitivity.py). Not a defect: a plain fp32 evaluation of the same schedule
    on 1 x 16 matrices errs as much (median 1.7e-5, the peer 5.4e-6, 200 draws).
  - scale of the orthogonalized matrix, from its (rows, cols): "spectral" (default)
    sqrt(max(rows, cols)), "shape_scaling" sqrt(max(1, rows/cols)), "unit_rms_norm"
    sqrt(rows/cols); times `extra_scale_factor`. So the case's lr modes map to: rms_norm ->
    "spectral" x 0.2 (0.2 sqrt(max)), spectral_norm -> "unit_rms_norm" (`emerging-muon`) or
    "shape_scaling" (`emerging-muon-shape-scaling`, declared clamped); none has no mode.
  - 2-D parameters only: `orthogonalize` raises ValueError for any other rank (no flatten option;
    its docstring leaves convolutions to a subclass). Not distributed through DTensor (its tensor
    parallelism is Megatron's process groups): no distributed adapter.
The step has no `torch.compile`; `use_syrk=False` (its Triton SYRK kernel needs an SM80/90/100 GPU).
"""

from __future__ import annotations

import importlib
import sys
import types

import torch

from cases import Case
from harness.targets.peers import PeerTarget
from oracles import Conventions, Orthogonalizer
from oracles.coefficients import POLAR_EXPRESS_4DP, YOU_QUINTICS

EPS = 1e-7
"""`newton_schulz`'s eps: X0 = U / max(||U||_F, eps)."""

MATMUL_PRECISION = types.MappingProxyType({"bf16": "medium", "fp32": "highest"})
"""case.compute_dtype -> the `fp32_matmul_prec` under which the peer iterates in that format."""

COEFFICIENTS = types.MappingProxyType({"newton_schulz": "quintic", "polar_express": "polar_express"})
"""case.orthogonalizer -> the peer's `coefficient_type`."""

SPECTRAL_MODES = types.MappingProxyType({"unit_rms_norm": "spectral_norm", "shape_scaling": "spectral_norm_clamped"})
"""The peer's scale mode run for the spectral_norm cases -> the lr-scale convention it follows."""


class EmergingMuon(PeerTarget):
    package = "emerging_optimizers.orthogonalized_optimizers"
    distribution = "emerging-optimizers"
    extra = "emerging-optimizers"
    exact_relations = True

    def __init__(self, spectral_mode: str = "unit_rms_norm") -> None:
        if spectral_mode not in SPECTRAL_MODES:
            raise ValueError(f"spectral_mode={spectral_mode!r}; expected one of {sorted(SPECTRAL_MODES)}")
        self.spectral_mode = spectral_mode
        self.name = "emerging-muon" if spectral_mode == "unit_rms_norm" else "emerging-muon-shape-scaling"
        self.import_error: ImportError | None = None
        try:
            self.module = importlib.import_module(self.package)
        except ImportError as exc:
            self.module, self.import_error = None, exc

    @property
    def missing(self) -> str | None:
        """Why the peer cannot be imported here (not installed, Python < 3.12, triton absent), or None."""
        if self.import_error is None:
            return None
        install = f"pip install 'muon-conformance[{self.extra}]' (Python >= 3.12)"
        if getattr(self.import_error, "name", None) == self.package.partition(".")[0]:
            return f"package {self.distribution} is not installed: {install}"
        if tuple(sys.version_info[:2]) < (3, 12):
            return (f"emerging-optimizers needs Python >= 3.12 (it imports typing.override); this is Python "
                    f"{'.'.join(map(str, sys.version_info[:2]))}: {self.import_error}")
        return f"cannot import {self.package} ({self.import_error}): {install}"

    def peer_unsupported(self, case: Case) -> str | None:
        if case.optimizer != "muon":
            return f"emerging-optimizers' Muon implements Muon only (case: {case.optimizer})"
        if len(case.shape) != 2:
            return f"emerging-optimizers' Muon takes 2-D parameters only, with no flatten (case: {len(case.shape)}-D)"
        if case.param_dtype != "fp32":
            return f"emerging-optimizers' newton_schulz takes fp32 input only (case: {case.param_dtype} parameters)"
        if case.orthogonalizer not in COEFFICIENTS:
            return f"emerging-optimizers' Muon has Newton-Schulz schedules only (case: {case.orthogonalizer})"
        if case.compute_dtype not in MATMUL_PRECISION:
            return f"emerging-optimizers' Muon iterates in fp32 or bf16 only (case: {case.compute_dtype})"
        if case.adjust_lr == "none":
            return "emerging-optimizers' Muon has no unscaled mode (its modes: spectral, shape_scaling, unit_rms_norm)"
        return None

    def conventions(self, case: Case) -> Conventions:
        schedule = POLAR_EXPRESS_4DP if case.orthogonalizer == "polar_express" else YOU_QUINTICS
        return Conventions(
            orthogonalizer=Orthogonalizer.polynomial(schedule, eps=EPS, form="clamp"),
            momentum="ema", nesterov="ema", weight_decay_order="before", weight_decay_lr="base",
            lr_scale="rms_norm" if case.adjust_lr == "rms_norm" else SPECTRAL_MODES[self.spectral_mode],
            lr_dims="flattened", compute_dtype=case.compute_dtype, state_dtype=case.param_dtype)

    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        assert self.module is not None
        scale = ("spectral", 0.2) if case.adjust_lr == "rms_norm" else (self.spectral_mode, 1.0)
        return self.module.Muon(params, lr=case.lr, momentum=case.momentum, weight_decay=case.weight_decay,
                                nesterov=case.nesterov, weight_decay_method="decoupled",
                                fp32_matmul_prec=MATMUL_PRECISION[case.compute_dtype],
                                coefficient_type=COEFFICIENTS[case.orthogonalizer], num_ns_steps=5,
                                scale_mode=scale[0], extra_scale_factor=scale[1], use_syrk=False)


def target() -> EmergingMuon:
    return EmergingMuon("unit_rms_norm")


def shape_scaling() -> EmergingMuon:
    return EmergingMuon("shape_scaling")
