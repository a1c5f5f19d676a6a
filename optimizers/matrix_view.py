"""How a stack of same-shape parameters [N, *shape] is seen as matrices, and the
learning-rate scale that goes with that view.

flatten=True:  [N, out, *rest] -> [N, out, prod(rest)]  (stack axis kept: never [N, numel])
flatten=False: [N, *lead, m, n] -> [N * prod(lead), m, n] (a batch of trailing matrices)
num_heads=h:   [N, h * head_dim, n] -> [N * h, head_dim, n]  (2-D parameters: one matrix per head)

`View` holds a group's choice of these (an algorithm record's `view` accessor gives it: optimizers/algorithms/).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ADJUST_LR = ("spectral_norm", "rms_norm", None)


@dataclass(frozen=True)
class View:
    """How a matrix group's parameters are seen as matrices (`flatten`; `num_heads`: a 2-D parameter as its head
    blocks, None: whole) and, when TP-sharded, orthogonalized (`tp_mode`: optimizers/tensor_parallel.py)."""

    flatten: bool
    num_heads: int | None = None
    tp_mode: str = "gather"

    def matrices(self, stack: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """`as_matrices` of a stack [k, *piece] of members of global `shape` (whole, or TP shards)."""
        return as_matrices(stack, self.flatten, None if self.num_heads is None else shape[0] // self.num_heads)

    def dims(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """`matrix_dims` of a parameter of `shape`."""
        return matrix_dims(shape, self.flatten, self.num_heads)

    def count(self, shape: tuple[int, ...]) -> int:
        """`matrix_count` of a parameter of `shape`."""
        return matrix_count(shape, self.flatten, self.num_heads)


def as_matrices(stack: torch.Tensor, flatten: bool, head_dim: int | None = None) -> torch.Tensor:
    """View `stack` [N, *shape] as the matrices [B, m, n] to orthogonalize; with `head_dim`, a stack of
    2-D parameters (or of their whole-head row pieces) as its head blocks [head_dim, n]."""
    if stack.ndim < 3:
        raise ValueError(f"expected a stack of parameters of 2+ dims, got shape {tuple(stack.shape)}")
    if head_dim is not None:
        return stack.reshape(-1, head_dim, stack.shape[-1])
    if flatten:
        return stack.reshape(stack.shape[0], stack.shape[1], -1)
    return stack.reshape(-1, stack.shape[-2], stack.shape[-1])


def matrix_dims(shape: tuple[int, ...], flatten: bool, num_heads: int | None = None) -> tuple[int, int]:
    """(fan_out, fan_in) of one parameter of `shape` under the view above (with heads: of one head block)."""
    if num_heads is not None:
        return shape[0] // num_heads, shape[1]
    if flatten:
        return shape[0], math.prod(shape[1:])
    return shape[-2], shape[-1]


def matrix_count(shape: tuple[int, ...], flatten: bool, num_heads: int | None = None) -> int:
    """How many matrices `as_matrices` views one parameter of `shape` as."""
    if num_heads is not None:
        return num_heads
    return 1 if flatten else math.prod(shape[:-2])


def lr_scale(shape: tuple[int, ...], flatten: bool, adjust_lr: str | None, num_heads: int | None = None) -> float:
    """spectral_norm: sqrt(fan_out/fan_in); rms_norm: 0.2 sqrt(max(fan_out, fan_in)); None: 1."""
    fan_out, fan_in = matrix_dims(shape, flatten, num_heads)
    if adjust_lr == "spectral_norm":
        return math.sqrt(fan_out / fan_in)
    if adjust_lr == "rms_norm":
        return 0.2 * math.sqrt(max(fan_out, fan_in))
    if adjust_lr is None:
        return 1.0
    raise ValueError(f"unknown adjust_lr {adjust_lr!r}; expected one of {ADJUST_LR}")
