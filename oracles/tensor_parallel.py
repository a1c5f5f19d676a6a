"""FP64 references for tensor-parallel layouts of a Muon step's orthogonalization.

A tensor-parallel (TP) layout splits a weight [out, in] over `tp` ranks along one dim, in
torch.chunk pieces: column-parallel (PyTorch's ColwiseParallel) shards dim 0, so each rank holds
whole output rows; row-parallel (RowwiseParallel) shards dim 1, so each rank holds whole input
columns. Three ways to orthogonalize such a weight's update U:

  gather     orth(U) of the whole matrix, then each rank keeps its piece: layout invariant;
  per_shard  orth(U_r) of each rank's piece alone (what an optimizer that only sees its shard,
             such as DeepSpeed's Muon under AutoTP, computes): layout dependent, since
             orth(U_r) != orth(U)[piece r] whenever the other rows/columns are not orthogonal to it;
  per_head   with `num_heads`, U = [num_heads * head_dim, in] is orthogonalized as num_heads
             independent [head_dim, in] blocks; when every column-parallel piece holds whole heads,
             per-head on each piece equals the same blocks of per-head on the whole matrix.

Functions here return the orthogonalized update in U's shape; they never import torch.
"""

from __future__ import annotations

import numpy as np

from oracles.conventions import Conventions, Orthogonalizer
from oracles.muon_reference import MuonHyper, Momentum, apply_update, momentum_and_direction, orthogonalize
from oracles.rounding import round_direction

MODES = ("gather", "per_shard")


def piece_bounds(size: int, tp: int) -> list[tuple[int, int]]:
    """[start, stop) of each rank's piece of a dim of `size`, as torch.chunk (and DTensor Shard) cut it."""
    step = -(-size // tp)
    return [(min(size, r * step), min(size, (r + 1) * step)) for r in range(tp)]


def heads(u: np.ndarray, num_heads: int) -> np.ndarray:
    """U [num_heads * head_dim, in] as the stack [num_heads, head_dim, in]; ValueError if rows do not split."""
    if num_heads < 1 or u.shape[0] % num_heads:
        raise ValueError(f"{u.shape[0]} rows do not split into {num_heads} heads")
    return u.reshape(num_heads, u.shape[0] // num_heads, u.shape[1])


def orth_whole(u: np.ndarray, spec: Orthogonalizer, num_heads: int | None = None) -> np.ndarray:
    """orth(U) of a 2-D update, per head block when `num_heads` is given."""
    if num_heads is None:
        return orthogonalize(u, spec, flatten=True)
    return orthogonalize(heads(u, num_heads), spec, flatten=False).reshape(u.shape)


def orth_tp(u: np.ndarray, spec: Orthogonalizer, mode: str, dim: int, tp: int,
            num_heads: int | None = None) -> np.ndarray:
    """The orthogonalized update every rank of a `tp`-way split of `dim` holds, reassembled in U's shape.

    per_shard with num_heads orthogonalizes the heads inside each piece, so each piece must hold whole
    heads (dim 0 split at head boundaries); ValueError otherwise.
    """
    if mode not in MODES:
        raise ValueError(f"unknown tensor-parallel mode {mode!r}; expected one of {MODES}")
    if mode == "gather":
        return orth_whole(u, spec, num_heads)
    out = np.empty_like(u, dtype=np.float64)
    for lo, hi in piece_bounds(u.shape[dim], tp):
        index = (slice(lo, hi), slice(None)) if dim == 0 else (slice(None), slice(lo, hi))
        piece = u[index]
        if piece.size == 0:
            continue
        if num_heads is not None:
            if dim != 0:
                raise ValueError("per-head orthogonalization of a row-parallel (dim 1) piece: heads are rows")
            head_dim = u.shape[0] // num_heads
            if lo % head_dim or (hi - lo) % head_dim:
                raise ValueError(f"rows [{lo}, {hi}) of a {tp}-way split cut through heads of {head_dim} rows")
            out[index] = orth_whole(piece, spec, (hi - lo) // head_dim)
        else:
            out[index] = orthogonalize(piece, spec, flatten=True)
    return out


def dependence(u: np.ndarray, spec: Orthogonalizer, dim: int, tp: int,
               num_heads: int | None = None) -> tuple[float, float, list[float]]:
    """How far per_shard is from the unsharded update: (relative difference ||P - W|| / ||W||,
    cosine <P, W> / (||P|| ||W||), relative difference per rank's piece), W = orth_whole(U)."""
    whole = orth_whole(u, spec, num_heads)
    shard = orth_tp(u, spec, "per_shard", dim, tp, num_heads)
    per_rank = []
    for lo, hi in piece_bounds(u.shape[dim], tp):
        index = (slice(lo, hi), slice(None)) if dim == 0 else (slice(None), slice(lo, hi))
        if hi > lo:
            per_rank.append(float(np.linalg.norm(shard[index] - whole[index]) / np.linalg.norm(whole[index])))
    rel = float(np.linalg.norm(shard - whole) / np.linalg.norm(whole))
    cosine = float(np.sum(shard * whole) / (np.linalg.norm(shard) * np.linalg.norm(whole)))
    return rel, cosine, per_rank


def reference_tp_muon_step(x: np.ndarray, m: Momentum, g: np.ndarray, hyper: MuonHyper, conv: Conventions,
                           mode: str, dim: int, tp: int, num_heads: int | None = None) -> tuple[np.ndarray, Momentum]:
    """One FP64 Muon step of a 2-D weight under a `tp`-way TP split of `dim`: the momentum of the whole
    weight (elementwise, so layout free), O = orth_tp(round_compute(U)), and the lr scale of the whole
    weight, or of one head block [rows / num_heads, in] with heads: the TP mode changes O only."""
    m, u = momentum_and_direction(m, g, hyper, conv)
    rounded = round_direction(u, conv.compute_dtype) if conv.rounding == "nearest" else u
    o = orth_tp(rounded, conv.orthogonalizer, mode, dim, tp, num_heads)
    shape = None if num_heads is None else (x.shape[0] // num_heads, x.shape[1])
    return apply_update(np.asarray(x, dtype=np.float64), o, hyper, conv, shape), m
