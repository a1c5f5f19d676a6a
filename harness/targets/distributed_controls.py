"""Negative controls of distributed Muon: deliberately wrong distributed paths that the
distributed checks must flag (tests/test_distributed_controls.py). Each replaces only the
`exchange` stage of the case's algorithm record, the stage that turns a megabatch's pieces into
updates (optimizers/algorithms/base.py).

  local-shard   orthogonalizes each rank's local shard instead of the whole matrix (what
                tensor-parallel Muons do; layout dependent by construction)
  padding-leak  pads short shards to ceil(size/W) rows, all-gathers, and orthogonalizes the
                padded matrix before cutting the padding off. Zero padding would be harmless
                (zero rows stay zero and leave the norm alone), so the padding holds ones, as
                an uninitialised `torch.empty` buffer holds whatever was there
  wrong-params  returns each owner's results in reverse member order: a megabatch whose updates
                land on the wrong parameters (visible once an owner holds two or more members)
  no-gather     replicated: skips the all-gather, so each rank applies only the members it owns
                (the others get no update) and the replicas drift apart

Use as a target spec, e.g. `--target harness.targets.distributed_controls:local_shard`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness.targets.controls import Control
from optimizers import distributed
from optimizers.algorithms.base import Exchange

MatrixUpdate = Callable[[torch.Tensor], torch.Tensor]


def _local_shard(pieces: torch.Tensor, layout: distributed.Layout, update: MatrixUpdate) -> torch.Tensor:
    return update(pieces) if pieces.numel() else pieces


def _padding_leak(pieces: torch.Tensor, layout: distributed.Layout, update: MatrixUpdate) -> torch.Tensor:
    if layout.dim is None:
        return distributed.exchange(pieces, layout, update)
    axis = layout.dim + 1
    chunk = -(-layout.shape[layout.dim] // layout.world)
    short = chunk - pieces.shape[axis]
    pad = [0, 0] * (pieces.ndim - 1 - axis) + [0, short]  # F.pad lists dims from the last one
    padded = F.pad(pieces, pad, value=1.0)
    gathered = [torch.empty_like(padded) for _ in range(layout.world)]
    dist.all_gather(gathered, padded.contiguous(), group=layout.group)
    done = update(torch.cat(gathered, dim=axis))
    return done.narrow(axis, layout.rank * chunk, pieces.shape[axis])


def _wrong_params(pieces: torch.Tensor, layout: distributed.Layout, update: MatrixUpdate) -> torch.Tensor:
    done = update(distributed.assemble(pieces, layout))
    return distributed.scatter(done.flip(0), layout, pieces.shape[0])


def _no_gather(pieces: torch.Tensor, layout: distributed.Layout, update: MatrixUpdate) -> torch.Tensor:
    if layout.dim is not None:
        return distributed.exchange(pieces, layout, update)
    out = torch.zeros_like(pieces)
    mine = layout.members(layout.rank)
    if pieces[mine].shape[0]:
        out[mine] = update(pieces[mine])
    return out


def with_exchange(name: str, exchange: Exchange) -> Control:
    """A control running the case's algorithm with its exchange stage replaced by `exchange`."""
    return Control(name, lambda algorithm: dataclasses.replace(algorithm, exchange=exchange))


def local_shard() -> Control:
    return with_exchange("control-local-shard", _local_shard)


def padding_leak() -> Control:
    return with_exchange("control-padding-leak", _padding_leak)


def wrong_params() -> Control:
    return with_exchange("control-wrong-params", _wrong_params)


def no_gather() -> Control:
    return with_exchange("control-no-gather", _no_gather)
