"""Muon: the momentum (or Nesterov) direction orthogonalized; under a tensor-parallel layout the
same-sharding reference (oracles/tensor_parallel.py)."""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

import numpy as np

from cases import Case
from cases.layouts import piece_sizes, shard_dim
from harness.algorithms import AlgorithmInfo, Directions, Oracle
from oracles import Conventions, MuonHyper, reference_muon_step
from oracles.muon_reference import matrix_view, momentum_and_direction
from oracles.rounding import round_direction
from oracles.tensor_parallel import piece_bounds, reference_tp_muon_step


def hyper(case: Case) -> MuonHyper:
    return MuonHyper(case.lr, case.momentum, case.nesterov, case.weight_decay, case.flatten)


def row_blocks(case: Case) -> list[int] | None:
    """Under Shard(0) each rank's rows: the blocks a shard-local norm restore runs over."""
    return piece_sizes(case.shape[0], case.world_size) if shard_dim(case.layout) == 0 else None


def _oracle(case: Case, conv: Conventions) -> Oracle:
    """Muon's reference; under a TP layout its same-sharding one: the whole matrix for gather, each TP
    shard alone for per_shard, per head block with heads."""
    tp = case.tensor_parallel

    def step(x: np.ndarray, m: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        if tp is None:
            return (*reference_muon_step(x, m, g, hyper(case), conv), math.inf)
        return (*reference_tp_muon_step(x, m, g, hyper(case), conv, tp.mode, tp.dim, tp.degree(case.world_size),
                                        tp.heads), math.inf)
    return Oracle(np.zeros(case.shape), step)


def _invariant(case: Case) -> bool:
    """Layout invariant except per_shard TP, which depends on the TP degree, unless every TP shard
    holds whole heads (then it is the unsharded per-head update: per-head exactness)."""
    tp = case.tensor_parallel
    return tp is None or tp.mode == "gather" or tp.heads is not None


def _options(case: Case) -> dict[str, Any]:
    """A TP case's mode and heads (optimizers/tensor_parallel.py)."""
    tp = case.tensor_parallel
    return {} if tp is None else {"tp_mode": tp.mode, "num_heads": tp.heads}


def tp_matrices(u: np.ndarray, case: Case) -> list[np.ndarray]:
    """The matrices a TP case orthogonalizes, as stacks [B, m, n] (uneven shards differ in shape): the
    whole matrix for gather, each TP shard for per_shard, each one's head blocks with heads."""
    tp = case.tensor_parallel
    blocks = [u]
    if tp.mode == "per_shard":
        cut = (lambda lo, hi: u[lo:hi]) if tp.dim == 0 else (lambda lo, hi: u[:, lo:hi])
        blocks = [cut(lo, hi) for lo, hi in piece_bounds(u.shape[tp.dim], tp.degree(case.world_size)) if hi > lo]
    if tp.heads is None:
        return [b[None] for b in blocks]
    head_dim = u.shape[0] // tp.heads
    return [b.reshape(-1, head_dim, b.shape[1]) for b in blocks]


def momentum_directions(case: Case, conv: Conventions) -> Directions:
    """Muon's and NorMuon's: U (momentum, or its Nesterov form) in the compute format, per matrix of the view."""
    def step(m: Any, g: np.ndarray) -> tuple[Any, Any]:
        m, u = momentum_and_direction(m, g, hyper(case), conv)
        if case.tensor_parallel is not None:
            return m, tp_matrices(round_direction(u, conv.compute_dtype), case)
        return m, matrix_view(round_direction(u, conv.compute_dtype), case.flatten)
    return Directions(np.zeros(case.shape), step)


DEFAULTS = MappingProxyType(dict(momentum=0.95, nesterov=False, weight_decay=0.0, adjust_lr="spectral_norm",
                                 flatten=False, orthogonalizer="polar_express"))
"""`optimizers.Muon`'s documented defaults of a matrix algorithm's shared options (docs/optimizers.md)."""

INFO = AlgorithmInfo("muon", _oracle, momentum_directions, layout_invariant=_invariant, options=_options,
                     defaults=DEFAULTS, robust_checks=("spectrum",), drift=True)
