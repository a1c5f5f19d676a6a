"""dtensor-muon's Muon (`dtensor_muon.Muon`) with its defaults (cautious weight decay on).

What its source does (dtensor-muon 0.1.0, optim/optim.py, orthogonalize/):
  - momentum as a sum M <- mu M + G in an fp32 buffer (whatever the parameter dtype); Nesterov
    U = G + mu M; parameters are updated in fp32 and copied back.
  - U cast to bf16, then Polar Express (default) with the 5-step table of safety 1.02 from
    X0 = U / (1.02 ||U||_F + 1e-7), or Keller Jordan's quintic from U / (||U||_F + 1e-7).
  - flatten (group key, default True): [out, prod(rest)]; without it, 3-D parameters are a batch
    of their trailing matrices and 4-D+ ones are refused.
  - lr scale sqrt(max(1, fan_out/fan_in)) of that view, an fp32 tensor, times the fp32 lr tensor.
  - decay folded into the update: X <- X - lr_adj (O + wd X [O X > 0]): cautious decay with the
    adjusted lr. O is zeropower's bf16 tensor and the decay is added into it in place
    (`u.addcmul_(param_fp32, u * param_fp32 > 0, value=wd)`), so O + wd X is rounded to bf16 before
    it reaches the fp32 parameter: declared `decay_dtype="bf16"`.
Its `zeropower` takes `use_triton=True` by default and Muon does not expose it; the Triton
kernels assert CUDA. On CPU the adapter calls dtensor-muon's own pure-torch loops (`ns_loop`,
`pe_loop`: `use_triton=False`) by rebinding the name Muon looks up for the duration of a run
or step, and bypasses `torch.compile` (eager). Distributed cases run its DTensor path.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator, Sequence

import torch

from cases import Case
from harness.targets.peers import PeerTarget
from oracles import Conventions, Orthogonalizer
from oracles.coefficients import POLAR_EXPRESS_SAFETY_102

EPS = 1e-7
"""The eps `zeropower` passes to its loops."""


class DtensorMuon(PeerTarget):
    name = "dtensor-muon"
    package = "dtensor_muon.optim.optim"
    distribution = "dtensor-muon"
    extra = "dtensor-muon"
    exact_relations = True

    def peer_unsupported(self, case: Case) -> str | None:
        if case.optimizer != "muon":
            return f"dtensor-muon implements Muon only (case: {case.optimizer})"
        if case.orthogonalizer not in ("polar_express", "newton_schulz"):
            return f"dtensor-muon orthogonalizes by Polar Express or Newton-Schulz only (case: {case.orthogonalizer})"
        if case.compute_dtype != "bf16":
            return f"dtensor-muon always orthogonalizes in bf16 (case: {case.compute_dtype})"
        if case.adjust_lr != "spectral_norm":
            return f"dtensor-muon has one lr scale, sqrt(max(1, fan_out/fan_in)) (case: {case.adjust_lr})"
        if len(case.shape) > 3 and not case.flatten:
            return f"dtensor-muon refuses a {len(case.shape)}-D parameter without flatten"
        return None

    def conventions(self, case: Case) -> Conventions:
        if case.orthogonalizer == "polar_express":
            orth = Orthogonalizer.polynomial(POLAR_EXPRESS_SAFETY_102, eps=EPS, scale=1.02)
        else:
            orth = Orthogonalizer.named("newton_schulz", eps=EPS)
        return Conventions(
            orthogonalizer=orth, weight_decay_lr="adjusted", weight_decay_mask="cautious",
            lr_scale="spectral_norm_clamped", lr_dims="flattened" if case.flatten else "last_two",
            compute_dtype="bf16", state_dtype="fp32", lr_dtype="fp32", decay_dtype="bf16")

    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        assert self.module is not None
        return self.module.Muon([{"params": params, "flatten": case.flatten}], lr=case.lr, wd=case.weight_decay,
                                momentum=case.momentum, nesterov=case.nesterov,
                                orthogonalization_strategy=case.orthogonalizer)

    @contextlib.contextmanager
    def _cpu_loops(self) -> Iterator[None]:
        """Muon's `zeropower` with use_triton=False, eagerly, for the duration of the block."""
        assert self.module is not None
        triton = self.module.zeropower
        self.module.zeropower = functools.partial(triton, use_triton=False)
        try:
            with torch.compiler.set_stance("force_eager"):
                yield
        finally:
            self.module.zeropower = triton

    def run(self, params: Sequence[torch.Tensor], grads: Sequence[Sequence[torch.Tensor]],
            case: Case) -> list[list[torch.Tensor]]:
        with self._cpu_loops():
            return super().run(params, grads, case)

    def make_distributed(self, params: list[torch.nn.Parameter], case: Case, mesh: object) -> torch.optim.Optimizer:
        """Its DTensor path: Muon takes DTensor (or replicated plain) parameters as they are; each
        step gathers a sharded update with `full_tensor()`, orthogonalizes it whole and
        redistributes it. The mesh comes with the parameters, so it is not passed."""
        optimizer = self.make(params, case)
        step = optimizer.step

        def cpu_step(*args, **kwargs):
            with self._cpu_loops():
                return step(*args, **kwargs)

        optimizer.step = cpu_step  # type: ignore[method-assign]
        return optimizer


def target() -> DtensorMuon:
    return DtensorMuon()
