"""Muon as an algorithm record. Per parameter, with momentum mu, learning rate lr, weight decay wd:

  M <- mu M + G
  U = G + mu M   (Nesterov)   else   U = M
  O = orth(U)    per matrix of the parameter's matrix view (optimizers.matrix_view; with num_heads,
                 per head block), of the whole matrix or of each TP shard (tp_mode:
                 optimizers/tensor_parallel.py)
  X <- X (1 - lr wd)
  X <- X - lr scale O           scale from `adjust_lr` and the matrix view
"""

from __future__ import annotations

import torch

from optimizers import elementwise, kernels
from optimizers.algorithms.base import Algorithm, Group, State, StateKey, foreach_exact, parameter_shape
from optimizers.algorithms.stages import Direction, Orthogonalize
from optimizers.coefficients import DEFAULT_STEPS
from optimizers.distributed import local
from optimizers.launches import device_of
from optimizers.matrix_view import ADJUST_LR, lr_scale
from optimizers.gram_newton_schulz import RESTARTS, iteration_dtype, takes_gram_iteration
from optimizers.orthogonalize import ORTHOGONALIZERS, SCHEDULES, orthogonalize
from optimizers.tensor_parallel import TP_MODES
from optimizers.validation import check_params, check_real

COMPUTE_DTYPES = (None, torch.float64, torch.float32, torch.bfloat16, torch.float16)


def default_compute_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CUDA (tensor cores), fp32 elsewhere."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def validate_muon(where: str, group: Group) -> None:
    """Options of a Muon group: parameters of 2+ dims, momentum in [0, 1), the orthogonalizer's options."""
    check_params(where, group["params"], 2)
    check_real(where, "momentum", group["momentum"], 0.0, 1.0, high_open=True)
    check_real(where, "eps", group["eps"], 0.0)
    if group["adjust_lr"] not in ADJUST_LR:
        raise ValueError(f"{where}: unknown adjust_lr {group['adjust_lr']!r}; expected one of {ADJUST_LR}")
    if group["orthogonalizer"] not in ORTHOGONALIZERS:
        raise ValueError(f"{where}: unknown orthogonalizer {group['orthogonalizer']!r}; "
                         f"expected one of {ORTHOGONALIZERS}")
    steps = group["ns_steps"]
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"{where}: ns_steps must be a positive integer or None, got {steps!r}")
    coefficients, restarts = group["ns_coefficients"], group["gram_restarts"]
    if coefficients is not None and (group["orthogonalizer"] != "gram_newton_schulz" or coefficients not in SCHEDULES):
        raise ValueError(f"{where}: ns_coefficients={coefficients!r} chooses the schedule of "
                         f"orthogonalizer='gram_newton_schulz' only, one of {SCHEDULES} (or None: {SCHEDULES[0]})")
    if not isinstance(restarts, (tuple, list)) or any(
            isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in restarts):
        raise ValueError(f"{where}: gram_restarts must be a tuple of step indices >= 0, got {restarts!r}")
    if group["compute_dtype"] not in COMPUTE_DTYPES:
        raise ValueError(f"{where}: compute_dtype {group['compute_dtype']!r} is not one of {COMPUTE_DTYPES}")
    for flag in ("nesterov", "flatten"):
        if not isinstance(group[flag], bool):
            raise TypeError(f"{where}: {flag} must be a bool, got {group[flag]!r}")
    check_tp_options(where, group)


def check_tp_options(where: str, group: Group) -> None:
    """tp_mode is one of TP_MODES; num_heads is None or a positive int dividing the rows of every
    parameter, which must then be 2-D."""
    if group["tp_mode"] not in TP_MODES:
        raise ValueError(f"{where}: unknown tp_mode {group['tp_mode']!r}; expected one of {TP_MODES}")
    heads = group["num_heads"]
    if heads is None:
        return
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise ValueError(f"{where}: num_heads must be a positive integer or None, got {heads!r}")
    for i, p in enumerate(group["params"]):
        if p.ndim != 2 or p.shape[0] % heads:
            raise ValueError(f"{where}: parameter {i} of shape {tuple(p.shape)} does not split into num_heads="
                             f"{heads} head blocks [head_dim, in] (a 2-D parameter whose rows num_heads divides)")


def momentum_direction(grad: torch.Tensor, state: State, group: Group) -> torch.Tensor:
    """M <- mu M + G (in place); returns G + mu M with Nesterov, else M."""
    g, buf = local(grad), local(state["momentum_buffer"])
    buf.mul_(group["momentum"]).add_(g)
    return g.add(buf, alpha=group["momentum"]) if group["nesterov"] else buf


def momentum_directions(grads: list[torch.Tensor], states: list[State], group: Group
                        ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """`momentum_direction` of many parameters at once, with the same bits: each elementwise pass is one
    torch._foreach_* call over all of them (a few kernel launches on CUDA instead of two per parameter), or
    where the group's `fused` option takes the kernels (optimizers/kernels.py) the momentum in one fused launch;
    with a half-type parameter among them, one by one (base.FOREACH_DTYPES). Also returns, where the fused
    launch ran and the directions are the buffers themselves (no Nesterov), their sums of squares in parts
    ([N, P] fp64, optimizers/elementwise.py `norms`); else None."""
    if not grads:
        return [], None
    gs, bufs = [local(g) for g in grads], [local(s["momentum_buffer"]) for s in states]
    if not foreach_exact(gs, bufs):  # half types one by one (base.FOREACH_DTYPES)
        return [momentum_direction(g, s, group) for g, s in zip(grads, states)], None
    # the fused kernel's bits are these passes'
    parts = elementwise.momentum_(bufs, gs, group["momentum"], kernels.of(group["fused"], bufs[0]))
    if parts is None:
        torch._foreach_mul_(bufs, group["momentum"])
        torch._foreach_add_(bufs, gs)
    if group["nesterov"]:
        return torch._foreach_add(gs, bufs, alpha=group["momentum"]), None
    return bufs, parts


def orthogonalize_group(mats: torch.Tensor, group: Group, out_dtype: torch.dtype | None = None,
                        norms: torch.Tensor | None = None) -> torch.Tensor:
    """orth of every matrix of `mats` [B, m, n] with the group's orthogonalizer, steps, eps, compute dtype
    and Triton kernels (its `fused` option, optimizers/kernels.py), returned in `out_dtype` (default `mats`'
    dtype); `norms`: their Frobenius norms [B], where known (Gram Newton-Schulz only:
    optimizers/orthogonalize.py)."""
    compute = group["compute_dtype"] or default_compute_dtype(device_of(mats))
    return orthogonalize(mats, group["orthogonalizer"], group["ns_steps"] or DEFAULT_STEPS, group["eps"], compute,
                         group["ns_coefficients"], tuple(group["gram_restarts"]), out_dtype, norms,
                         kernels.of(group["fused"], mats))


def direct_dtype(group: Group, device: torch.device, rows: int, cols: int, fused: bool) -> torch.dtype | None:
    """The dtype `orthogonalize_group` may return its result in, uncast, for parameters on `device` whose
    matrices are rows x cols (stages.Orthogonalize.direct): the compute dtype where it is bf16/fp16 (not under
    "svd", which computes in fp32/fp64); a tall result (computed as its transpose: a transposed view, which the
    cast would make contiguous) only with `fused`. Gram Newton–Schulz iterating in another dtype
    (gram_newton_schulz.iteration_dtype: bf16 in fp16) returns a wide or tall result in that dtype, only with
    `fused` (its dtype depends on the shape and on a fallback: the same bits, but for a divergence's fallback,
    whose bf16 values below 2^-17 in magnitude round to fp16's subnormal spacing); square matrices take the
    standard iteration, in the compute dtype."""
    if group["orthogonalizer"] == "svd":
        return None
    compute = group["compute_dtype"] or default_compute_dtype(device)
    if compute not in (torch.bfloat16, torch.float16):
        return None
    if (group["orthogonalizer"] == "gram_newton_schulz" and iteration_dtype(compute) != compute
            and takes_gram_iteration(rows, cols)):
        return iteration_dtype(compute) if fused else None
    return compute if fused or rows <= cols else None


def takes_norms(group: Group) -> bool:
    """Gram Newton–Schulz (whose normaliser is formed in at least fp32) may divide by norms given to it."""
    return group["orthogonalizer"] == "gram_newton_schulz"


CAPTURED = ("polar_express", "newton_schulz", "gram_newton_schulz")
"""Orthogonalizers a CUDA graph may capture (optimizers/graphs.py): the polynomials have no host
synchronisation; Gram Newton–Schulz's divergence check is deferred past the replay. Not "svd": cuSOLVER
checks its info on the host."""


def captured(group: Group) -> bool:
    """The group's orthogonalizer is one of CAPTURED."""
    return group["orthogonalizer"] in CAPTURED


def checked(group: Group, rows: int, cols: int) -> bool:
    """Gram Newton–Schulz checks a wide or tall result on the host (its divergence flags)."""
    return group["orthogonalizer"] == "gram_newton_schulz" and takes_gram_iteration(rows, cols)


def matrix_lr_scale(shape: tuple[int, ...], group: Group) -> float:
    """lr multiplier of a parameter of `shape`: `adjust_lr` on the fans of its matrix view (of one
    head block with num_heads), from its global shape under every TP mode."""
    return lr_scale(shape, group["flatten"], group["adjust_lr"], group["num_heads"])


MOMENTUM = StateKey("momentum_buffer", parameter_shape)

MOMENTUM_DIRECTION = Direction(momentum_direction, batched=momentum_directions, buffer=MOMENTUM.name)
"""Muon's direction stage, declared with its batched form and its buffer (optimizers/algorithms/stages.py)."""

ORTHOGONALIZE = Orthogonalize(orthogonalize_group, reads_only=True, direct=direct_dtype, norms=takes_norms,
                              captured=captured, checked=checked)
"""Muon's orthogonalize stage, declared with what the executor's fast paths rely on (stages.py)."""

MUON = Algorithm(
    name="muon",
    defaults=dict(momentum=0.95, nesterov=False, adjust_lr="spectral_norm", flatten=False,
                  orthogonalizer="polar_express", ns_steps=None, compute_dtype=None, eps=1e-7,
                  ns_coefficients=None, gram_restarts=RESTARTS, tp_mode="gather", num_heads=None),
    validate=validate_muon,
    state=(MOMENTUM,),
    direction=MOMENTUM_DIRECTION,
    orthogonalize=ORTHOGONALIZE,
    lr_scale=matrix_lr_scale,
)
