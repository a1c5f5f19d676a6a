"""heavyball's Muon (`heavyball.Muon`) with its default options.

What its source does (heavyball 3.2.1, chainable.py / utils.py):
  - momentum: with Nesterov (default) `nesterov_ema`: M <- mu M + (1-mu) G (an EMA, mu = betas[0])
    and U = G + M; without, `exp_avg`: the bias-corrected EMA (beta_t = 1 - (1-mu)/(1-mu^t)),
    U = M. The buffer is stored in fp32 (`storage_dtype="float32"`) whatever the parameter dtype.
  - orthogonalization of the parameter flattened to [out, prod(rest)] (always), by five distinct
    quintics (Jiacheng You's), after X0 = U / max(||U||_F, 1e-7); X0 is stochastically rounded to
    bf16 unless U is fp64, in which case the whole iteration runs in fp64. For bf16 parameters U
    itself is formed by a stochastically rounded bf16 add.
  - scale sqrt(max(1, rows/cols)) of the flattened matrix; decay X(1 - lr wd) - lr O with the
    base lr; the lr is a 0-d tensor of the parameter's promoted dtype (fp32 for fp32 and bf16
    parameters, fp64 for fp64 ones); bf16 parameters are written with stochastic rounding.
Stochastic rounding is declared (`rounding="stochastic"`): the reference is its expectation and
the bf16-compute tolerance (rtol >= 0.05) bounds it, as a 1-ulp rounding of X0 has normwise
relative error below 2^-8. `compile_step=False` and `torch.compile` bypassed: eager.
"""

from __future__ import annotations

import torch

from cases import Case
from harness.targets.peers import PeerTarget
from oracles import Conventions, Orthogonalizer
from oracles.coefficients import YOU_QUINTICS


class HeavyballMuon(PeerTarget):
    name = "heavyball"
    package = "heavyball"
    distribution = "heavyball"
    extra = "heavyball"

    def compute_dtype(self, case: Case) -> str:
        """fp64 parameters iterate in fp64; the others in bf16."""
        return "fp64" if case.param_dtype == "fp64" else "bf16"

    def peer_unsupported(self, case: Case) -> str | None:
        if case.optimizer != "muon":
            return f"heavyball.Muon implements Muon only (case: {case.optimizer})"
        if case.orthogonalizer != "newton_schulz":
            return f"heavyball.Muon has only its Newton-Schulz schedule (case: {case.orthogonalizer})"
        if case.adjust_lr != "spectral_norm":
            return f"heavyball.Muon has one lr scale, sqrt(max(1, rows/cols)) (case: {case.adjust_lr})"
        if len(case.shape) > 2 and not case.flatten:
            return "heavyball.Muon always flattens a parameter to [out, prod(rest)]"
        if case.compute_dtype != self.compute_dtype(case):
            return (f"heavyball.Muon computes {case.param_dtype} parameters in {self.compute_dtype(case)} "
                    f"(case: {case.compute_dtype})")
        return None

    def conventions(self, case: Case) -> Conventions:
        compute = self.compute_dtype(case)
        return Conventions(
            orthogonalizer=Orthogonalizer.polynomial(YOU_QUINTICS, eps=1e-7, form="clamp"),
            momentum="ema" if case.nesterov else "ema_debiased", nesterov="plus",
            lr_scale="spectral_norm_clamped", lr_dims="flattened", compute_dtype=compute,
            rounding="nearest" if compute == "fp64" else "stochastic", state_dtype="fp32",
            lr_dtype="fp32")

    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        assert self.module is not None
        return self.module.Muon(params, lr=case.lr, betas=(case.momentum, 0.99), weight_decay=case.weight_decay,
                                nesterov=case.nesterov, compile_step=False)


def target() -> HeavyballMuon:
    return HeavyballMuon()
