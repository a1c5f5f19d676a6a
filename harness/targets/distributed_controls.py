"""Negative controls of distributed Muon: deliberately wrong distributed paths that the
distributed checks must flag (tests/test_distributed_controls.py). Each overrides only
`Muon._distributed_orthogonalized`, the step that turns a megabatch's pieces into updates.

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

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

import optimizers
from harness.targets.controls import Control
from optimizers import distributed


class _LocalShardMuon(optimizers.Muon):
    def _distributed_orthogonalized(self, pieces: torch.Tensor, layout: distributed.Layout, group: dict[str, Any],
                                    device: torch.device) -> torch.Tensor:
        return self._orthogonalized(pieces, group, device) if pieces.numel() else pieces


class _PaddingLeakMuon(optimizers.Muon):
    def _distributed_orthogonalized(self, pieces: torch.Tensor, layout: distributed.Layout, group: dict[str, Any],
                                    device: torch.device) -> torch.Tensor:
        if layout.dim is None:
            return super()._distributed_orthogonalized(pieces, layout, group, device)
        axis = layout.dim + 1
        chunk = -(-layout.shape[layout.dim] // layout.world)
        short = chunk - pieces.shape[axis]
        pad = [0, 0] * (pieces.ndim - 1 - axis) + [0, short]  # F.pad lists dims from the last one
        padded = F.pad(pieces, pad, value=1.0)
        gathered = [torch.empty_like(padded) for _ in range(layout.world)]
        dist.all_gather(gathered, padded.contiguous(), group=layout.group)
        done = self._orthogonalized(torch.cat(gathered, dim=axis), group, device)
        return done.narrow(axis, layout.rank * chunk, pieces.shape[axis])


class _WrongParamsMuon(optimizers.Muon):
    def _distributed_orthogonalized(self, pieces: torch.Tensor, layout: distributed.Layout, group: dict[str, Any],
                                    device: torch.device) -> torch.Tensor:
        whole = distributed.assemble(pieces, layout)
        done = self._orthogonalized(whole, group, device) if whole.shape[0] else whole
        return distributed.scatter(done.flip(0), layout, pieces.shape[0])


class _NoGatherMuon(optimizers.Muon):
    def _distributed_orthogonalized(self, pieces: torch.Tensor, layout: distributed.Layout, group: dict[str, Any],
                                    device: torch.device) -> torch.Tensor:
        if layout.dim is not None:
            return super()._distributed_orthogonalized(pieces, layout, group, device)
        out = torch.zeros_like(pieces)
        mine = layout.members(layout.rank)
        if pieces[mine].shape[0]:
            out[mine] = self._orthogonalized(pieces[mine], group, device)
        return out


def local_shard() -> Control:
    return Control("control-local-shard", _LocalShardMuon)


def padding_leak() -> Control:
    return Control("control-padding-leak", _PaddingLeakMuon)


def wrong_params() -> Control:
    return Control("control-wrong-params", _WrongParamsMuon)


def no_gather() -> Control:
    return Control("control-no-gather", _NoGatherMuon)
