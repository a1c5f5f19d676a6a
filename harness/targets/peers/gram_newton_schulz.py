"""The gram-newton-schulz package's Muon (`gram_newton_schulz.Muon`), pure-torch path.

What its source does (gram-newton-schulz 0.1.6, muon/, gram_newton_schulz.py, coefficients.py):
  - momentum as a sum M <- mu M + G (buffer in the parameter dtype), Nesterov U = G + mu M;
    U is cast to bf16 first.
  - then U / (||U||_F + 1e-7) in fp32, cast to fp16, and the Gram Newton-Schulz iteration in fp16
    with restarts (exactly the standard iteration in exact arithmetic). Declared compute dtype:
    bf16, the coarser of the two roundings U goes through (the fp16 arithmetic after it is finer).
  - default coefficients: Polar Express's first five polynomials each divided by the safety
    1.05 (a/1.05, b/1.05^3, c/1.05^5), no factor in the normaliser; `YOU_COEFFICIENTS` (Jiacheng
    You's five quintics) is its Newton-Schulz preset, judged for the Newton-Schulz cases.
  - never flattens: 3-D+ parameters are batches of their trailing matrices; lr scale
    sqrt(fan_out/fan_in) unclamped or 0.2 sqrt(max) of the last two dims, or none.
  - decay X(1 - lr wd) with the base lr, before the update.
`ns_use_kernels=False` (its kernels need `quack` and a Hopper/Blackwell GPU); its
`torch.compile` (mode "reduce-overhead") is bypassed: eager. The restart position is auto-tuned
at construction, as by default (its progress print is silenced).
"""

from __future__ import annotations

import contextlib
import io

import torch

from cases import Case
from harness.targets.peers import PeerTarget
from oracles import Conventions, Orthogonalizer
from oracles.coefficients import GNS_SAFETY, POLAR_EXPRESS_RAW, YOU_QUINTICS, safety_scaled

EPS = 1e-7
"""gram-newton-schulz's default `ns_epsilon`."""

PRESETS = {"polar_express": "POLAR_EXPRESS_COEFFICIENTS", "newton_schulz": "YOU_COEFFICIENTS"}
"""case.orthogonalizer -> the package's coefficient preset."""


class GramNewtonSchulzMuon(PeerTarget):
    name = "gram-newton-schulz"
    package = "gram_newton_schulz"
    distribution = "gram-newton-schulz"
    extra = "gram-newton-schulz"
    exact_relations = True

    def peer_unsupported(self, case: Case) -> str | None:
        if case.optimizer != "muon":
            return f"gram-newton-schulz implements Muon only (case: {case.optimizer})"
        if case.orthogonalizer not in PRESETS:
            return f"gram-newton-schulz has Newton-Schulz schedules only (case: {case.orthogonalizer})"
        if case.compute_dtype != "bf16":
            return f"gram-newton-schulz casts U to bf16, then iterates in fp16 (case: {case.compute_dtype})"
        if case.flatten and len(case.shape) > 2:
            return "gram-newton-schulz never flattens: 3-D+ parameters are batches of their trailing matrices"
        return None

    def conventions(self, case: Case) -> Conventions:
        schedule = (safety_scaled(POLAR_EXPRESS_RAW[:5], GNS_SAFETY) if case.orthogonalizer == "polar_express"
                    else YOU_QUINTICS)
        return Conventions(orthogonalizer=Orthogonalizer.polynomial(schedule, eps=EPS), lr_scale=case.adjust_lr,
                           lr_dims="last_two", compute_dtype="bf16", state_dtype=case.param_dtype)

    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        assert self.module is not None
        with contextlib.redirect_stdout(io.StringIO()):
            return self.module.Muon(params, lr=case.lr, weight_decay=case.weight_decay, momentum=case.momentum,
                                    nesterov=case.nesterov, adjust_lr=None if case.adjust_lr == "none" else case.adjust_lr,
                                    ns_coefficients_preset=PRESETS[case.orthogonalizer], ns_use_kernels=False)


def target() -> GramNewtonSchulzMuon:
    return GramNewtonSchulzMuon()
