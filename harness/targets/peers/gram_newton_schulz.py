"""The gram-newton-schulz package's Muon (`gram_newton_schulz.Muon`), pure-torch path.

What its source does (gram-newton-schulz 0.1.6, muon/, gram_newton_schulz.py, coefficients.py):
  - momentum as a sum M <- mu M + G (buffer in the parameter dtype), Nesterov U = G + mu M;
    U is cast to bf16 first.
  - then U / (||U||_F + 1e-7) in fp32, cast to fp16, and its `ns_algorithm`: "gram_newton_schulz"
    (default; the Gram iteration with restarts, square matrices by the standard one), judged on the
    Gram Newton-Schulz cases (token `gns`) under the Gram keys, or "standard_newton_schulz", judged on
    the Newton-Schulz and Polar Express cases. Declared compute dtype: bf16, the coarser of the two
    roundings U goes through (the fp16 arithmetic after it is finer).
  - default coefficients: Polar Express's first five polynomials each divided by the safety
    1.05 (a/1.05, b/1.05^3, c/1.05^5), no factor in the normaliser (run on the `gns` and `pe` cases);
    `YOU_COEFFICIENTS` (Jiacheng You's five quintics) is its Newton-Schulz preset (the `ns` cases).
  - never flattens: 3-D+ parameters are batches of their trailing matrices; lr scale
    sqrt(fan_out/fan_in) unclamped or 0.2 sqrt(max) of the last two dims, or none.
  - decay X(1 - lr wd) with the base lr, before the update.
`ns_use_kernels=False` (its kernels need `quack` and a Hopper/Blackwell GPU); its
`torch.compile` (mode "reduce-overhead") is bypassed: eager. The restart position is auto-tuned
at construction, as by default (its progress print is silenced): before step 2 for both presets,
the restart our Gram Newton-Schulz makes (tests/test_peers.py checks it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import types

import torch

from cases import Case
from harness.targets.peers import PeerTarget
from oracles import Conventions, Orthogonalizer
from oracles.coefficients import GNS_SAFETY, POLAR_EXPRESS_RAW, YOU_QUINTICS, safety_scaled

EPS = 1e-7
"""gram-newton-schulz's default `ns_epsilon`."""

RUNS = types.MappingProxyType({"gram_newton_schulz": ("gram_newton_schulz", "POLAR_EXPRESS_COEFFICIENTS"),
        "polar_express": ("standard_newton_schulz", "POLAR_EXPRESS_COEFFICIENTS"),
        "newton_schulz": ("standard_newton_schulz", "YOU_COEFFICIENTS")})
"""case.orthogonalizer -> the package's (ns_algorithm, coefficient preset)."""


class GramNewtonSchulzMuon(PeerTarget):
    name = "gram-newton-schulz"
    package = "gram_newton_schulz"
    distribution = "gram-newton-schulz"
    extra = "gram-newton-schulz"
    exact_relations = True

    def peer_unsupported(self, case: Case) -> str | None:
        if case.optimizer != "muon":
            return f"gram-newton-schulz implements Muon only (case: {case.optimizer})"
        if case.orthogonalizer not in RUNS:
            return f"gram-newton-schulz has Newton-Schulz schedules only (case: {case.orthogonalizer})"
        if case.compute_dtype != "bf16":
            return f"gram-newton-schulz casts U to bf16, then iterates in fp16 (case: {case.compute_dtype})"
        if case.flatten and len(case.shape) > 2:
            return "gram-newton-schulz never flattens: 3-D+ parameters are batches of their trailing matrices"
        return None

    def conventions(self, case: Case) -> Conventions:
        algorithm, preset = RUNS[case.orthogonalizer]
        schedule = (safety_scaled(POLAR_EXPRESS_RAW[:5], GNS_SAFETY) if preset == "POLAR_EXPRESS_COEFFICIENTS"
                    else YOU_QUINTICS)
        orth = Orthogonalizer.polynomial(schedule, eps=EPS)
        if algorithm == "gram_newton_schulz":
            orth = dataclasses.replace(orth, iteration="gram")
        return Conventions(orthogonalizer=orth, lr_scale=case.adjust_lr,
                           lr_dims="last_two", compute_dtype="bf16", state_dtype=case.param_dtype)

    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        assert self.module is not None
        with contextlib.redirect_stdout(io.StringIO()):
            return self.module.Muon(params, lr=case.lr, weight_decay=case.weight_decay, momentum=case.momentum,
                                    nesterov=case.nesterov, adjust_lr=None if case.adjust_lr == "none" else case.adjust_lr,
                                    ns_algorithm=RUNS[case.orthogonalizer][0],
                                    ns_coefficients_preset=RUNS[case.orthogonalizer][1], ns_use_kernels=False)


def target() -> GramNewtonSchulzMuon:
    return GramNewtonSchulzMuon()
