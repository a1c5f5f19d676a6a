"""microsoft/dion's Muon and NorMuon (`dion.Muon`, `dion.NorMuon`); not on PyPI: install it from
a checkout (`pip install -e <dion checkout>`; judged at commit 0a059a4).

What its source does (dion/muon.py, normuon.py, megabatch_base.py, polar_express.py):
  - momentum as a sum M <- mu M + G, Nesterov U = G + mu M, the buffer in the parameter dtype;
    U is cast to bf16 before orthogonalization, always.
  - Polar Express (default): its own 5-step table (safety 1.02 folded in, not ours / 1.02) from
    X0 = U / (1.02 ||U||_F + eps); `use_polar_express=False`: Jiacheng You's five quintics from
    U / (||U||_F + eps); eps is the group's `epsilon` (1e-8). No SVD.
  - flatten=True: [out, prod(rest)]; otherwise a batch of the trailing matrices; lr scale
    sqrt(fan_out/fan_in) unclamped or 0.2 sqrt(max), fans from the same view.
  - decay X(1 - lr wd) with the base lr, before the update.
  - NorMuon: its row statistics and norm restore are those of every trailing 2-D slice of the
    parameter (variance buffer `zeros_like(p[..., 0:1])`), whatever `flatten` says. Without
    flatten that is a convention (a batch of matrices, each restored to its own norm): declared
    as normuon_rows "trailing". With flatten=True the optimizer promises the [out, prod(rest)]
    matrix, whose rows are the output channels: declared "matrix", so the harness judges the
    promise (a conv kernel's rows are not its kh x kw slices).
Every step function is wrapped in `torch.compile` at import; the adapter runs them eagerly
(`torch.compiler.set_stance("force_eager")`, see the package docstring) instead of compiling
each new shape (15-55 s on 2 CPU cores).
New dion optimizers (Dion2, NorDion2) are judged by adding an entry to `PEER_CLASSES` once the
case axes name them.
"""

from __future__ import annotations

import types
from typing import Any, Mapping

import torch

from cases import Case
from harness.targets.peers import PeerTarget
from oracles import Conventions, Orthogonalizer
from oracles.coefficients import POLAR_EXPRESS_SAFETY_102, YOU_QUINTICS

PEER_CLASSES = types.MappingProxyType({"muon": "Muon", "normuon": "NorMuon"})
"""case.optimizer -> the dion class that implements it."""

EPSILON = 1e-8
"""dion's default `epsilon`, the normaliser's eps."""


class DionTarget(PeerTarget):
    name = "dion"
    package = "dion"
    distribution = "dion"
    extra = "dion"
    exact_relations = True

    def peer_unsupported(self, case: Case) -> str | None:
        if case.optimizer not in PEER_CLASSES:
            return f"dion has no adapter for {case.optimizer}"
        if case.orthogonalizer not in ("polar_express", "newton_schulz"):
            return f"dion orthogonalizes by Polar Express or Newton-Schulz only (case: {case.orthogonalizer})"
        if case.compute_dtype != "bf16":
            return f"dion always orthogonalizes in bf16 (case: {case.compute_dtype})"
        return None

    def conventions(self, case: Case) -> Conventions:
        if case.orthogonalizer == "polar_express":
            orth = Orthogonalizer.polynomial(POLAR_EXPRESS_SAFETY_102, eps=EPSILON, scale=1.02)
        else:
            orth = Orthogonalizer.polynomial(YOU_QUINTICS, eps=EPSILON)
        return Conventions(
            orthogonalizer=orth, lr_scale=case.adjust_lr, lr_dims="flattened" if case.flatten else "last_two",
            compute_dtype="bf16", state_dtype=case.param_dtype,
            normuon_rows="matrix" if case.flatten else "trailing")

    def options(self, case: Case) -> dict:
        """dion keyword arguments for `case`."""
        extra = {"muon_beta2": case.beta2} if case.optimizer == "normuon" else {}
        return dict(lr=case.lr, mu=case.momentum, weight_decay=case.weight_decay, nesterov=case.nesterov,
                    adjust_lr=None if case.adjust_lr == "none" else case.adjust_lr, flatten=case.flatten,
                    use_polar_express=case.orthogonalizer == "polar_express", epsilon=EPSILON, **extra)

    def defaults(self, optimizer: str) -> Mapping[str, Any] | None:
        """dion's defaults at 0a059a4 (its constructors' signatures): mu 0.95, no Nesterov, weight decay 0.01,
        the spectral-norm lr scale, no flatten, Polar Express in bf16; NorMuon's muon_beta2 0.95."""
        if optimizer not in PEER_CLASSES:
            return None
        own = {"beta2": 0.95} if optimizer == "normuon" else {}
        return dict(momentum=0.95, nesterov=False, weight_decay=0.01, adjust_lr="spectral_norm", flatten=False,
                    orthogonalizer="polar_express", compute_dtype="bf16", **own)

    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        assert self.module is not None
        chosen = self.options(case) if case.construct == "explicit" else {"lr": case.lr}
        return getattr(self.module, PEER_CLASSES[case.optimizer])(params, **chosen)


    def make_distributed(self, params: list[torch.nn.Parameter], case: Case, mesh: object) -> torch.optim.Optimizer:
        """dion's distributed path: the 1-D DeviceMesh as `distributed_mesh` (DTensor parameters are
        exchanged by all-to-all; replicated ones orthogonalized by their owner and gathered)."""
        assert self.module is not None
        optimizer = getattr(self.module, PEER_CLASSES[case.optimizer])(params, distributed_mesh=mesh,
                                                                      **self.options(case))
        step = optimizer.step

        def eager_step(*args, **kwargs):
            with torch.compiler.set_stance("force_eager"):
                return step(*args, **kwargs)

        optimizer.step = eager_step  # type: ignore[method-assign]
        return optimizer


def target() -> DionTarget:
    return DionTarget()
