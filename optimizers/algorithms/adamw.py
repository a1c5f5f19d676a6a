"""AdamW for the parameters Muon should not orthogonalize (1-D, scalars, embeddings), as an
elementwise algorithm record (no matrix stages):

  m <- b1 m + (1 - b1) G;  v <- b2 v + (1 - b2) G^2        direction: returns m
  X <- X (1 - lr wd)
  X <- X - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)   apply
"""

from __future__ import annotations

import torch

from optimizers.algorithms.base import Algorithm, Group, State, StateKey, parameter_shape
from optimizers.distributed import local
from optimizers.validation import check_params, check_real


def validate_adamw(where: str, group: Group) -> None:
    """Parameters of any rank, betas a pair in [0, 1), adamw_eps >= 0."""
    check_params(where, group["params"], 0)
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"{where}: betas must be a pair, got {betas!r}")
    for j, beta in enumerate(betas):
        check_real(where, f"betas[{j}]", beta, 0.0, 1.0, high_open=True)
    check_real(where, "adamw_eps", group["adamw_eps"], 0.0)


def moments(grad: torch.Tensor, state: State, group: Group) -> torch.Tensor:
    """t <- t + 1; the two moment updates (in place); returns m."""
    beta1, beta2 = group["betas"]
    g, m, v = local(grad), local(state["exp_avg"]), local(state["exp_avg_sq"])
    state["step"] += 1
    m.lerp_(g, 1.0 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
    return m


def adam_apply(x: torch.Tensor, update: torch.Tensor, state: State, group: Group, scale: float) -> None:
    """Decoupled decay, then the bias-corrected step with denominator sqrt(v / (1 - b2^t)) + eps."""
    beta1, beta2 = group["betas"]
    t, lr = state["step"], group["lr"]
    denom = (local(state["exp_avg_sq"]) / (1.0 - beta2**t)).sqrt_().add_(group["adamw_eps"])
    x.mul_(1.0 - lr * group["weight_decay"])
    x.addcdiv_(update, denom, value=-lr * scale / (1.0 - beta1**t))


ADAMW = Algorithm(
    name="adamw",
    defaults=dict(betas=(0.9, 0.95), adamw_eps=1e-8),
    validate=validate_adamw,
    state=(StateKey("step", None), StateKey("exp_avg", parameter_shape),
           StateKey("exp_avg_sq", parameter_shape, nonnegative=True)),
    direction=moments,
    orthogonalize=None,
    apply=adam_apply,
)
