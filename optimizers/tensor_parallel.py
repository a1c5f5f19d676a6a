"""Tensor parallelism and meshes of more than one dim: what a TP-sharded parameter's update is.

A parameter is TP-sharded when it is a DTensor placed Shard(d) on the mesh dim named `tp_dim`
(default "tp"): PyTorch's ColwiseParallel gives Shard(0) (each TP rank holds whole output rows),
RowwiseParallel gives Shard(1) (whole input columns). On a 1-D mesh named `tp_dim` every sharded
parameter is TP-sharded. The group option `tp_mode` says what such a parameter's update is:

  gather     orth(U) of the whole matrix, each rank keeping its piece: the unsharded update, bitwise
             where the orthogonalizer's dispatch is the same (the whole members are stacked as in one
             process);
  per_shard  orth(U_t) of each TP shard U_t alone, with no communication for it (what DeepSpeed's
             Muon under AutoTP computes): it depends on the TP degree. The lr scale is still that of
             the whole parameter (its global shape, or its head block with `num_heads`), so the TP
             degree changes the orthogonalization only, never the step size.

Other mesh dims (FSDP2's "dp", sharding the TP shard again, Shard(0) or _StridedShard(0)) never
change the update: the pieces are all-gathered along them first. So on a 2-D ("dp", "tp") mesh a
parameter's pieces are gathered over "dp" into its TP shard (DTensor redistribute), then

  gather     the TP shards go to the member's owner on the "tp" group and are orthogonalized there
             whole (optimizers/distributed.py, the 1-D exchange), and come back;
  per_shard  each TP shard is orthogonalized where it is;

and each rank keeps its "dp" piece of the result (a local slice, no communication). On a mesh
with no `tp_dim` dim the whole matrix is gathered on every rank and orthogonalized there (the
gather semantics, at the cost of the same orthogonalization on every rank).

`num_heads` (group option) views a 2-D update [num_heads * head_dim, in] as num_heads matrices
[head_dim, in], orthogonalized each alone, with the lr scale of one head block. per_shard with
heads needs every TP shard to hold whole heads (column-parallel shards cut at head boundaries):
checked at construction, before any step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from optimizers import distributed
from optimizers.matrix_view import View

TP_MODES = ("gather", "per_shard")


def tp_index(p: DTensor, tp_dim: str) -> int | None:
    """The index of `p`'s mesh dim named `tp_dim`, None if its mesh has none."""
    names = p.device_mesh.mesh_dim_names or ()
    return names.index(tp_dim) if tp_dim in names else None


def tp_shard(p: torch.Tensor, tp_dim: str) -> int | None:
    """d when `p` is a DTensor placed Shard(d) on the mesh dim `tp_dim`, else None."""
    if not isinstance(p, DTensor):
        return None
    index = tp_index(p, tp_dim)
    placement = None if index is None else p.placements[index]
    return placement.dim if isinstance(placement, Shard) else None


def uses_mesh_layout(p: torch.Tensor, mode: str, tp_dim: str) -> bool:
    """True when `p`'s update runs through `MeshLayout` rather than the 1-D exchange: a DTensor on a
    mesh of 2+ dims, or a TP-sharded one under per_shard."""
    if not isinstance(p, DTensor):
        return False
    return p.device_mesh.ndim > 1 or (mode == "per_shard" and tp_shard(p, tp_dim) is not None)


def check_heads(where: str, index: int, p: torch.Tensor, view: View, tp_dim: str) -> None:
    """A per_shard parameter with `num_heads` (of its group's `view`) must have whole heads in every TP shard:
    ValueError naming the parameter otherwise (row-parallel shards split every head's columns; column-parallel
    shards of torch.chunk sizes must be multiples of head_dim)."""
    heads, dim = view.num_heads, tp_shard(p, tp_dim)
    if heads is None or view.tp_mode != "per_shard" or dim is None:
        return
    at = f"{where}: parameter {index} of shape {tuple(p.shape)} (num_heads={heads}, tp_mode='per_shard')"
    if dim != 0:
        raise ValueError(f"{at} is TP-sharded on dim {dim}: per-head orthogonalization of one shard needs whole "
                         f"head rows; use tp_mode='gather' or column-parallel (Shard(0)) sharding")
    head_dim = p.shape[0] // heads
    sizes = distributed.chunk_sizes(p.shape[0], p.device_mesh.size(tp_index(p, tp_dim) or 0))
    if any(size % head_dim for size in sizes):
        raise ValueError(f"{at}: its TP shards of {sizes} rows cut through heads of {head_dim} rows; use "
                         f"tp_mode='gather', or a TP degree that divides num_heads")


@dataclass(frozen=True)
class MeshLayout:
    """How the members of one megabatch lie on a mesh that is not one plain 1-D exchange.

    placements: the members' placements; gathered: the same with every mesh dim but the TP one
    Replicate (the TP one too when not `inner`); inner: the 1-D exchange over the TP group for
    gather mode, None when each rank orthogonalizes what `gathered` gives it.
    """

    mesh: DeviceMesh
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    placements: tuple
    gathered: tuple
    inner: distributed.Layout | None

    def _move(self, pieces: torch.Tensor, source: tuple, target: tuple) -> torch.Tensor:
        """[N, *piece under source] -> [N, *piece under target], member by member."""
        if source == target:
            return pieces
        moved = [DTensor.from_local(piece, self.mesh, source, run_check=False, shape=torch.Size(self.shape),
                                    stride=self.stride).redistribute(self.mesh, target).to_local()
                 for piece in pieces.unbind(0)]
        return torch.stack(moved) if moved else pieces

    def exchange(self, pieces: torch.Tensor, matrix_update: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """This rank's pieces [N, *piece] -> its pieces of every member's update (module docstring)."""
        held = self._move(pieces, self.placements, self.gathered)
        if self.inner is not None:
            done = distributed.exchange(held, self.inner, matrix_update)
        else:
            done = matrix_update(held) if held.numel() else held
        return self._move(done, self.gathered, self.placements).contiguous()


def mesh_layout(p: DTensor, mode: str, tp_dim: str, start: int) -> MeshLayout:
    """The MeshLayout of parameter `p` under `mode` (member 0's owner on the TP group: `start`)."""
    index, dim = tp_index(p, tp_dim), tp_shard(p, tp_dim)
    gathered = [Replicate()] * p.device_mesh.ndim
    inner = None
    if dim is not None:
        gathered[index] = Shard(dim)
        if mode == "gather":
            group = p.device_mesh.get_group(index)
            inner = distributed.Layout(group, tuple(p.shape), dim, start % dist.get_world_size(group))
    return MeshLayout(p.device_mesh, tuple(p.shape), tuple(p.stride()), tuple(p.placements), tuple(gathered), inner)


__all__ = ["MeshLayout", "TP_MODES", "check_heads", "mesh_layout", "tp_shard", "uses_mesh_layout"]
