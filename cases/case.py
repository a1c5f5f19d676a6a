"""`Case`: one fully specified optimizer test, with a stable human-readable id.

The id names every axis in a fixed order and parses back (`Case.from_id`), so a
case reproduces on its own: `python -m harness run --select <id>`.

  muon/conv2d-8x4x3x3/mb3/flat/bf16@fp32/pe/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0
  |    |              |   |    |         |  |             |        |     |      |        seed
  |    layer-shape    |   |    param@compute dtype        |        |     steps  gradient kind
  optimizer           |   flatten | noflat  adjust_lr      nesterov|plain
                      megabatch size   orthogonalizer (ns, pe, svd)   weight decay

A distributed case appends its layout and world size (cases/layouts.py):

  muon/conv2d-8x4x3x3/mb3/flat/fp32@fp32/pe/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0/shard0/ws3
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cases import axes, layouts


@dataclass(frozen=True)
class Case:
    """An optimizer test: what parameters, what gradients, which hyper-parameters."""

    layer: str
    megabatch: int
    flatten: bool
    param_dtype: str
    compute_dtype: str
    orthogonalizer: str
    adjust_lr: str
    nesterov: bool
    weight_decay: float
    steps: int
    grad: str
    seed: int = 0
    optimizer: str = "muon"
    layout: str = "single"
    world_size: int = 1

    def __post_init__(self) -> None:
        allowed = {"layer": tuple(axes.all_layers()), "param_dtype": axes.DTYPES,
                   "compute_dtype": axes.DTYPES, "orthogonalizer": axes.ORTHOGONALIZERS,
                   "adjust_lr": axes.ADJUST_LR, "grad": axes.GRADIENTS, "optimizer": axes.OPTIMIZERS}
        for name, values in allowed.items():
            if getattr(self, name) not in values:
                raise ValueError(f"Case.{name}={getattr(self, name)!r}; expected one of {values}")
        if (self.param_dtype, self.compute_dtype) not in axes.DTYPE_PAIRS:
            raise ValueError(f"Case: {self.param_dtype}@{self.compute_dtype} is not one of the dtype pairs "
                             f"{['@'.join(p) for p in axes.DTYPE_PAIRS]}")
        if not axes.compute_ok(self.orthogonalizer, self.compute_dtype):
            raise ValueError(f"Case: {self.orthogonalizer} cannot compute in {self.compute_dtype}")
        if self.megabatch < 1 or self.steps < 1 or self.seed < 0:
            raise ValueError(f"Case: megabatch, steps must be >= 1 and seed >= 0 ({self})")
        if not math.isfinite(self.weight_decay) or self.weight_decay < 0:
            raise ValueError(f"Case.weight_decay={self.weight_decay!r} must be finite and >= 0")
        why = layouts.invalid(self.layout, self.world_size)
        if why:
            raise ValueError(f"Case: {why}")

    @property
    def lr(self) -> float:
        return axes.LR

    @property
    def momentum(self) -> float:
        return axes.MOMENTUM

    @property
    def beta2(self) -> float:
        return axes.BETA2

    @property
    def kind(self) -> str:
        """Layer kind: linear, conv1d, conv2d or conv3d."""
        return axes.all_layers()[self.layer][0]

    @property
    def shape(self) -> tuple[int, ...]:
        return axes.all_layers()[self.layer][1]

    @property
    def shape_text(self) -> str:
        return "x".join(map(str, self.shape))

    @property
    def id(self) -> str:
        return "/".join([
            self.optimizer,
            f"{self.layer}-{self.shape_text}",
            f"mb{self.megabatch}",
            "flat" if self.flatten else "noflat",
            f"{self.param_dtype}@{self.compute_dtype}",
            axes.ORTH_TOKENS[self.orthogonalizer],
            self.adjust_lr,
            "nesterov" if self.nesterov else "plain",
            f"wd{self.weight_decay:g}",
            f"steps{self.steps}",
            self.grad,
            f"seed{self.seed}",
            *layouts.id_tokens(self.layout, self.world_size),
        ])

    @property
    def layout_detail(self) -> str:
        """The layout as reports show it: single, replicated, or shard<d>-even|uneven|empty."""
        return layouts.detail(self.layout, self.world_size, self.shape)

    @classmethod
    def from_id(cls, case_id: str) -> "Case":
        """Parse an id made by `Case.id`; ValueError names the token that does not fit."""
        tokens = case_id.split("/")
        if len(tokens) not in (12, 14):
            raise ValueError(f"not a case id (expected 12 '/'-separated tokens, or 14 for a distributed case, "
                             f"got {len(tokens)}): {case_id!r}")
        opt, layer_shape, mb, flat, dtypes, orth, adjust, nest, wd, steps, grad, seed = tokens[:12]
        layer, _, shape_text = layer_shape.rpartition("-")
        orth_names = {v: k for k, v in axes.ORTH_TOKENS.items()}
        param_dtype, _, compute_dtype = dtypes.partition("@")
        try:
            case = cls(layer=layer, megabatch=int(mb.removeprefix("mb")), flatten={"flat": True, "noflat": False}[flat],
                       param_dtype=param_dtype, compute_dtype=compute_dtype, orthogonalizer=orth_names[orth],
                       adjust_lr=adjust, nesterov={"nesterov": True, "plain": False}[nest],
                       weight_decay=float(wd.removeprefix("wd")), steps=int(steps.removeprefix("steps")),
                       grad=grad, seed=int(seed.removeprefix("seed")), optimizer=opt,
                       **layouts.parse_tokens(tokens[12:]))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"not a case id: {case_id!r} ({exc})") from None
        if case.shape_text != shape_text or case.id != case_id:
            raise ValueError(f"not a canonical case id: {case_id!r} (canonical: {case.id!r})")
        return case
