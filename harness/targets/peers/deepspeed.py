"""DeepSpeed's single-device Muon (`deepspeed.runtime.zero.muon.original_muon.SingleDeviceMuon`),
with either Newton-Schulz method: `deepspeed-gram` (its default) and `deepspeed-standard`.

Install with `DS_BUILD_OPS=0` (no ops are built) and run with `DS_ACCELERATOR=cpu` (this module
sets it when unset, before importing DeepSpeed, so the CPU accelerator is selected).

What its source does (DeepSpeed 0.19.8, original_muon.py):
  - always Nesterov, momentum as an EMA by `lerp`: M <- mu M + (1-mu) G, U = (1-mu) G + mu M;
    the buffer is `zeros_like(p)`, stored in the parameter's dtype.
  - Keller Jordan's quintic, 5 steps, normaliser ||X||_F + 1e-7.
  - "standard": U cast to `ns_compute_dtype("standard")` (bf16 where supported) then normalised;
    judged on the Newton-Schulz cases.
    "gram": U normalised in its own dtype, then cast to `ns_compute_dtype("gram")` (fp16 where
    the accelerator supports it, else fp32), and the Gram iteration with a restart before step 2
    (square matrices: the standard one), our Gram Newton-Schulz's restarts: the same polynomial in
    exact arithmetic, another rounding, so it is judged on the Gram Newton-Schulz cases (token `gns`)
    under the Gram keys of Keller Jordan's quintic. The adapter asks DeepSpeed for the dtype of each
    method, so it declares what runs here (on this CPU: gram fp32, standard bf16).
  - 4-D parameters are flattened to [out, in*kh*kw] (so a 4-D case without flatten is unsupported);
    3-D and 5-D ones are orthogonalized as batches of their trailing matrices whatever is asked: there
    is no flatten switch. A flattened Conv1d or Conv3d case runs as DeepSpeed runs it, and is judged
    against the flattened reference: convolution weights must be flattened, and a target that slices
    them is wrong, not unsupported (README, Findings).
  - the lr scale is sqrt(max(1, rows/cols)) of the parameter's LAST TWO dims, even when a 4-D
    parameter was flattened (it reads kh/kw there): declared as lr_dims "last_two".
  - decay X(1 - lr wd) with the base lr, before the update.
`torch.compile` (its `@compiler.compile()`) is bypassed: the peer runs eagerly.
"""

from __future__ import annotations

import dataclasses
import os
import types
from typing import Any, Mapping

import torch

from cases import Case
from harness.targets.peers import FORMAT_OF, PeerTarget
from oracles import Conventions, Orthogonalizer

os.environ.setdefault("DS_ACCELERATOR", "cpu")

ORTHOGONALIZERS = types.MappingProxyType({"gram": "gram_newton_schulz", "standard": "newton_schulz"})
"""ns_method -> the case orthogonalizer whose cases it is judged on."""


class DeepSpeedMuon(PeerTarget):
    package = "deepspeed.runtime.zero.muon.original_muon"
    distribution = "deepspeed"
    extra = "deepspeed"
    exact_relations = True

    def __init__(self, ns_method: str) -> None:
        super().__init__()
        self.ns_method = ns_method
        self.name = f"deepspeed-{ns_method}"

    def compute_dtype(self) -> str:
        """The format DeepSpeed computes this method's iteration in on this accelerator."""
        assert self.module is not None
        return FORMAT_OF[self.module.ns_compute_dtype(self.ns_method)]

    def peer_unsupported(self, case: Case) -> str | None:
        if case.optimizer != "muon":
            return f"DeepSpeed implements Muon only (case: {case.optimizer})"
        if not case.nesterov:
            return "DeepSpeed's Muon is always Nesterov"
        if case.orthogonalizer != ORTHOGONALIZERS[self.ns_method]:
            return (f"DeepSpeed's {self.ns_method} method runs Keller Jordan's quintic by "
                    f"{ORTHOGONALIZERS[self.ns_method]} only (case: {case.orthogonalizer})")
        if case.adjust_lr != "spectral_norm":
            return f"DeepSpeed's Muon has one lr scale, sqrt(max(1, rows/cols)) (case: {case.adjust_lr})"
        if len(case.shape) == 4 and not case.flatten:
            return "DeepSpeed's Muon always flattens a 4-D parameter (case: flatten=False)"
        if case.compute_dtype != self.compute_dtype():
            return (f"DeepSpeed's {self.ns_method} Newton-Schulz computes in {self.compute_dtype()} on this "
                    f"accelerator (case: {case.compute_dtype})")
        return None

    def conventions(self, case: Case) -> Conventions:
        orth = Orthogonalizer.named("newton_schulz", eps=1e-7)
        return Conventions(
            orthogonalizer=dataclasses.replace(orth, iteration="gram") if self.ns_method == "gram" else orth,
            momentum="ema", nesterov="ema", lr_scale="spectral_norm_clamped", lr_dims="last_two",
            compute_dtype=case.compute_dtype, state_dtype=case.param_dtype)

    def defaults(self, optimizer: str) -> Mapping[str, Any] | None:
        """SingleDeviceMuon's defaults in 0.19.8 (its signature): momentum 0.95, weight decay 0, ns_method
        "gram", so only the gram method's are its defaults."""
        if optimizer != "muon" or self.ns_method != "gram" or self.module is None:
            return None
        return dict(momentum=0.95, nesterov=True, weight_decay=0.0, adjust_lr="spectral_norm",
                    orthogonalizer=ORTHOGONALIZERS["gram"], compute_dtype=self.compute_dtype())

    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        assert self.module is not None
        if case.construct == "defaults":
            return self.module.SingleDeviceMuon(params, lr=case.lr)
        return self.module.SingleDeviceMuon(params, lr=case.lr, momentum=case.momentum,
                                            weight_decay=case.weight_decay, ns_method=self.ns_method)


def gram() -> DeepSpeedMuon:
    return DeepSpeedMuon("gram")


def standard() -> DeepSpeedMuon:
    return DeepSpeedMuon("standard")
