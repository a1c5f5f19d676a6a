"""AdamW for the parameters Muon should not orthogonalize (1-D, scalars, embeddings).

  X <- X (1 - lr wd)
  m <- b1 m + (1 - b1) G;  v <- b2 v + (1 - b2) G^2
  X <- X - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
"""

from __future__ import annotations

import math
from typing import Any

import torch


def step_group(group: dict[str, Any], state: dict[torch.Tensor, dict[str, Any]]) -> None:
    """Apply one AdamW step to every parameter of `group` that has a gradient."""
    beta1, beta2 = group["betas"]
    lr, eps = group["lr"], group["adamw_eps"]
    for p in group["params"]:
        if p.grad is None:
            continue
        s = state[p]
        if "step" not in s:
            s["step"] = 0
            s["exp_avg"] = torch.zeros_like(p)
            s["exp_avg_sq"] = torch.zeros_like(p)
        s["step"] += 1
        t = s["step"]
        s["exp_avg"].lerp_(p.grad, 1.0 - beta1)
        s["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1.0 - beta2)
        denom = (s["exp_avg_sq"] / (1.0 - beta2**t)).sqrt_().add_(eps)
        p.mul_(1.0 - lr * group["weight_decay"])
        p.addcdiv_(s["exp_avg"], denom, value=-lr / (1.0 - beta1**t))
