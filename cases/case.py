"""`Case`: one fully specified optimizer test, with a stable human-readable id.

The id names every axis in a fixed order and parses back (`Case.from_id`), so a
case reproduces on its own: `python -m harness run --select <id>`.

  muon/conv2d-8x4x3x3/mb3/flat/bf16@fp32/pe/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0
  |    |              |   |    |         |  |             |        |     |      |        seed
  |    layer-shape    |   |    param@compute dtype        |        |     steps  gradient kind
  optimizer           |   flatten | noflat  adjust_lr      nesterov|plain
                      megabatch size   orthogonalizer (ns, pe, svd, gns)   weight decay

A distributed case appends its layout and world size (cases/layouts.py):

  muon/conv2d-8x4x3x3/mb3/flat/fp32@fp32/pe/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0/shard0/ws3
  muon/linear-12x20/mb2/noflat/fp64@fp64/pe/spectral_norm/plain/wd0.1/steps2/gaussian/seed0/dp2tp0-per_shard-h4/ws4

Dion2 and NorDion2 carry their selected fraction in the optimizer token, and a distributed
case its selection scope too (plain: they have no Nesterov form):

  dion2-f0.25/conv2d-8x4x3x3/mb3/flat/fp32@fp32/pe/spectral_norm/plain/wd0.1/steps3/gaussian/seed0
  nordion2-f0.5-global/conv2d-8x4x3x3/mb2/flat/fp32@fp32/pe/none/plain/wd0/steps3/gaussian/seed0/shard0/ws3
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cases import algorithms, axes, layouts, schema


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
    fraction: float | None = None
    scope: str | None = None
    lr: float = axes.LR
    momentum: float = axes.MOMENTUM
    beta2: float = axes.BETA2
    ef_decay: float = axes.EF_DECAY
    """Dion2's error-feedback decay (its `momentum` is unused: fraction 1 is Muon with momentum ef_decay)."""
    construct: str = axes.CONSTRUCTIONS[0]
    """How the optimizer is built (axes.CONSTRUCTIONS): every hyper-parameter passed, or its defaults taken."""

    def __post_init__(self) -> None:
        allowed = {"layer": tuple(axes.known_layers()), "param_dtype": axes.DTYPES,
                   "compute_dtype": axes.DTYPES,
                   "orthogonalizer": axes.EVERY_ORTHOGONALIZER + (axes.NO_ORTHOGONALIZER,),
                   "adjust_lr": axes.ADJUST_LR, "grad": axes.GRADIENTS + (axes.EXTREME_GRADIENT, axes.NONFINITE_GRADIENT),
                   "optimizer": algorithms.names(), "construct": axes.CONSTRUCTIONS}
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
        dim = layouts.shard_dim(self.layout)
        if not why and dim is not None and dim >= len(self.shape):
            why = f"{self.layout} shards dim {dim} of a {len(self.shape)}-D parameter"
        tp = layouts.tensor_parallel(self.layout)
        if tp is not None:
            why = why or layouts.tp_invalid(tp, self.world_size, self.shape) or (
                None if algorithms.entry(self.optimizer).tensor_parallel
                else f"{self.optimizer} cases have no tensor-parallel layouts")
        if why:
            raise ValueError(f"Case: {why}")
        self._check_selection()
        self._check_hyper()
        self._check_elementwise()

    def _check_selection(self) -> None:
        """fraction (and scope, when distributed) exactly for the selecting optimizers."""
        if not algorithms.entry(self.optimizer).selecting:
            if self.fraction is not None or self.scope is not None:
                raise ValueError(f"Case: {self.optimizer} takes no fraction or selection scope")
            return
        if self.fraction is None or not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"Case.fraction={self.fraction!r}: {self.optimizer} needs a fraction in (0, 1]")
        if self.nesterov:
            raise ValueError(f"Case: {self.optimizer} has no Nesterov form (nesterov must be False)")
        if (self.scope is None) != (self.layout == "single") or self.scope not in (None, *axes.SCOPES):
            raise ValueError(f"Case.scope={self.scope!r}: a distributed {self.optimizer} case needs one of "
                             f"{axes.SCOPES}, a single-process one none (the scopes coincide there)")

    def _check_elementwise(self) -> None:
        """An elementwise algorithm (AdamW) has no orthogonalizer, lr scale, Nesterov form or matrix view and
        computes in its parameter's dtype; the others orthogonalize matrices: no 1-D or embedding layers. A
        1-D parameter has no rank to set (VECTOR_GRADIENTS)."""
        if algorithms.entry(self.optimizer).elementwise:
            plain = (self.orthogonalizer == axes.NO_ORTHOGONALIZER and self.adjust_lr == "none" and not self.nesterov
                     and not self.flatten and self.compute_dtype == self.param_dtype)
            if not plain:
                raise ValueError(f"Case: {self.optimizer} is elementwise: orthogonalizer none, adjust_lr none, no "
                                 f"Nesterov, no flatten, and compute in the parameter's dtype ({self})")
            if self.grad == axes.EXTREME_GRADIENT:
                raise ValueError(f"Case: {self.optimizer} squares its gradients, which overflows at extreme ones in "
                                 f"any implementation (torch.optim.AdamW's too): no {axes.EXTREME_GRADIENT} gradients")
        elif self.orthogonalizer == axes.NO_ORTHOGONALIZER or self.layer in axes.VECTOR_LAYERS:
            raise ValueError(f"Case: {self.optimizer} orthogonalizes matrices: it needs an orthogonalizer and a "
                             f"matrix or convolution layer, not {self.layer} with {self.orthogonalizer}")
        if len(self.shape) < 2 and self.grad not in axes.VECTOR_GRADIENTS:
            raise ValueError(f"Case: a {len(self.shape)}-D parameter takes gradients {axes.VECTOR_GRADIENTS}, "
                             f"not {self.grad!r}")

    def _check_hyper(self) -> None:
        """lr > 0; momentum, beta2 and ef_decay in [0, 1) (beta2 and ef_decay at least 1e-4, so that their
        id tokens hold no exponent); each away from its default only for an algorithm that has it."""
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"Case.lr={self.lr!r} must be finite and > 0")
        for name, low in (("momentum", 0.0), ("beta2", 1e-4), ("ef_decay", 1e-4)):
            value = getattr(self, name)
            if not low <= value < 1.0:
                raise ValueError(f"Case.{name}={value!r} must lie in [{low:g}, 1)")
        own = algorithms.entry(self.optimizer).hyper
        for name in ("momentum", "beta2", "ef_decay"):
            if name not in own and getattr(self, name) != axes.HYPER_DEFAULTS[name]:
                raise ValueError(f"Case.{name}={getattr(self, name)!r}: {self.optimizer} has no {name} "
                                 f"(its hyper-parameters: {', '.join(own) or 'none'})")

    @property
    def optimizer_token(self) -> str:
        """The optimizer with its fraction, its own hyper-parameters away from their defaults, how it is built
        where that is from its defaults, and its scope: muon, dion2-f0.25, dion2-f0.25-ef0.9-global,
        normuon-b0.99, normuon-defaults."""
        parts = [self.optimizer] + ([f"f{self.fraction:g}"] if self.fraction is not None else [])
        parts += [f"ef{self.ef_decay:g}"] if self.ef_decay != axes.EF_DECAY else []
        parts += [f"b{self.beta2:g}"] if self.beta2 != axes.BETA2 else []
        parts += [self.construct] if self.construct != axes.CONSTRUCTIONS[0] else []
        return "-".join(parts + ([self.scope] if self.scope else []))

    @property
    def kind(self) -> str:
        """Layer kind: linear, conv1d, conv2d or conv3d."""
        return axes.known_layers()[self.layer][0]

    @property
    def shape(self) -> tuple[int, ...]:
        return axes.known_layers()[self.layer][1]

    @property
    def shape_text(self) -> str:
        return "x".join(map(str, self.shape))

    @property
    def id(self) -> str:
        """Its tokens in the order of cases/schema.py `TOKENS`."""
        return schema.write_id(self)

    @property
    def tensor_parallel(self) -> layouts.TensorParallel | None:
        """The case's TP layout (mode, split dim, heads), None for the other layouts."""
        return layouts.tensor_parallel(self.layout)

    @property
    def layout_detail(self) -> str:
        """The layout as reports show it: single, replicated, or shard<d>-even|uneven|empty."""
        return layouts.detail(self.layout, self.world_size, self.shape)

    @classmethod
    def from_id(cls, case_id: str) -> "Case":
        """Parse an id made by `Case.id` (cases/schema.py reads its tokens); ValueError names the token
        that does not fit."""
        try:
            case = cls(**schema.read_id(case_id))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"not a case id: {case_id!r} ({exc})") from None
        if case.id != case_id:
            raise ValueError(f"not a canonical case id: {case_id!r} (canonical: {case.id!r})")
        return case
