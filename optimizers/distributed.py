"""Distributed Muon: every whole matrix is orthogonalized once, on one rank, and shared.

One megabatch is N same-shape parameters of one group, on a process group of W ranks.
Member j is owned by rank (start + j) mod W, where `start` counts the members of the
megabatches before it in the step, so that many small megabatches spread over all ranks
(a megabatch size that is not a multiple of W leaves some owners with fewer members, or none).

  replicated  (DDP) every rank holds every member whole: the owner orthogonalizes its
              members and the results are all-gathered, so every rank applies the same bytes.
  Shard(d)    (DTensor on a 1-D mesh, as FSDP2 makes with d = 0): rank r holds the slice
              [o_r, o_r + n_r) of dim d, with n_r as torch.chunk splits (ceil(size/W) each,
              the last ranks smaller or empty). One all-to-all sends every rank's piece of
              member j to its owner, which concatenates the pieces along d into the whole
              parameter, orthogonalizes it, and a second all-to-all returns each rank its
              piece of the result.

There is no padding: pieces travel at their exact sizes (all_to_all_single takes uneven and
empty splits), so nothing but real rows ever enters an orthogonalized matrix. The all-gather
of the replicated layout is an all_to_all_single too, for the same reason.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor import zeros as distributed_zeros


def process_group(mesh: Any) -> dist.ProcessGroup | None:
    """The process group of `Muon(mesh=...)`, over which every rank agrees on each step: None, a
    ProcessGroup, the group of a 1-D DeviceMesh, or the flattened group of a DeviceMesh of more dims
    (e.g. ("dp", "tp"); optimizers/tensor_parallel.py)."""
    if mesh is None:
        return None
    if isinstance(mesh, DeviceMesh):
        if mesh.ndim == 1:
            return mesh.get_group()
        if not mesh.mesh_dim_names:
            raise ValueError(f"Muon(mesh=...): a {mesh.ndim}-D DeviceMesh {tuple(mesh.shape)} needs mesh_dim_names "
                             f"(e.g. ('dp', 'tp')), which name its tensor-parallel dim")
        return mesh._flatten().get_group()
    if isinstance(mesh, dist.ProcessGroup):
        return mesh
    raise TypeError(f"Muon(mesh=...) takes a ProcessGroup or a DeviceMesh, got {type(mesh).__name__}")


def chunk_sizes(size: int, world: int) -> list[int]:
    """Sizes of the W pieces torch.chunk (and DTensor's Shard) cuts `size` into:
    ceil(size/W) each, the last ranks smaller or empty."""
    step = -(-size // world)
    return [max(0, min(step, size - r * step)) for r in range(world)]


def shard_dim(p: torch.Tensor) -> int | None:
    """d for a DTensor sharded as Shard(d) on a 1-D mesh; None for a replicated parameter."""
    if isinstance(p, DTensor):
        (placement,) = p.placements
        if isinstance(placement, Shard):
            return placement.dim
    return None


def placements(p: torch.Tensor) -> tuple:
    """A DTensor's placements, () for a plain tensor: members of one megabatch share these."""
    return tuple(p.placements) if isinstance(p, DTensor) else ()


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's data of `t`: the local shard of a DTensor (aliasing it), `t` itself otherwise."""
    return t.to_local() if isinstance(t, DTensor) else t


def zeros_placed_like(p: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Zeros of global `shape` (same rank as `p`, dim 0 equal) placed as `p` is: a DTensor on `p`'s
    mesh and placements when `p` is one, so a Shard(0) piece holds the rows of `p`'s piece
    (`torch.zeros_like(p)`, memory format included, when `shape` is `p`'s)."""
    if shape == tuple(p.shape):
        return torch.zeros_like(p)
    if not isinstance(p, DTensor):
        return torch.zeros(shape, dtype=p.dtype, device=p.device)
    return distributed_zeros(shape, device_mesh=p.device_mesh, placements=p.placements, dtype=p.dtype)


@dataclass(frozen=True)
class Layout:
    """How the members of one megabatch lie on the ranks of `group`.

    shape: the global shape of one member; dim: the sharded dim, None when replicated;
    start: the owner of member 0.
    """

    group: dist.ProcessGroup
    shape: tuple[int, ...]
    dim: int | None
    start: int

    @property
    def world(self) -> int:
        return dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    def piece_shape(self, rank: int) -> tuple[int, ...]:
        """Shape of `rank`'s piece of one member."""
        if self.dim is None:
            return self.shape
        shape = list(self.shape)
        shape[self.dim] = chunk_sizes(self.shape[self.dim], self.world)[rank]
        return tuple(shape)

    def members(self, rank: int) -> slice:
        """The members `rank` owns, as a slice of the megabatch: j = (rank - start) mod W, then every W-th."""
        return slice((rank - self.start) % self.world, None, self.world)

    def owned(self, n: int, rank: int) -> int:
        """How many members of a megabatch of `n` `rank` owns."""
        return len(range(n)[self.members(rank)])


def layout_of(p: torch.Tensor, group: dist.ProcessGroup, start: int) -> Layout:
    """The layout of parameter `p` (member 0 owned by rank `start` mod W); a DTensor's collectives
    run on its own mesh's group.

    Raises ValueError if a DTensor's local shard is not the torch.chunk piece this module assumes.
    """
    dim = shard_dim(p)
    if isinstance(p, DTensor):
        group = p.device_mesh.get_group()
    layout = Layout(group, tuple(p.shape), dim, start % dist.get_world_size(group))
    got = tuple(local(p).shape)
    if got != layout.piece_shape(layout.rank):
        raise ValueError(f"parameter of shape {layout.shape} sharded on dim {dim}: rank {layout.rank} holds "
                         f"{got}, expected the torch.chunk piece {layout.piece_shape(layout.rank)}")
    return layout


def _all_to_all(pieces: list[torch.Tensor], recv_numels: list[int], group: dist.ProcessGroup) -> list[torch.Tensor]:
    """all_to_all_single: pieces[r] goes to rank r; returns the flat pieces received from each rank."""
    send = torch.cat([p.reshape(-1) for p in pieces])
    recv = send.new_empty(sum(recv_numels))
    dist.all_to_all_single(recv, send, recv_numels, [p.numel() for p in pieces], group=group)
    return list(recv.split(recv_numels))


def assemble(pieces: torch.Tensor, layout: Layout) -> torch.Tensor:
    """This rank's pieces [N, *piece] of a megabatch -> the whole members it owns [k, *shape],
    in member order."""
    n, world, rank = pieces.shape[0], layout.world, layout.rank
    if layout.dim is None:
        return pieces[layout.members(rank)]
    k = layout.owned(n, rank)
    received = _all_to_all([pieces[layout.members(o)] for o in range(world)],
                         [k * math.prod(layout.piece_shape(s)) for s in range(world)], layout.group)
    parts = [flat.reshape(k, *layout.piece_shape(s)) for s, flat in enumerate(received)]
    return torch.cat(parts, dim=layout.dim + 1)


def scatter(whole: torch.Tensor, layout: Layout, n: int) -> torch.Tensor:
    """Inverse of `assemble`: the owned results [k, *shape] -> this rank's pieces [n, *piece] of
    every member's result (replicated: every member whole, as the owners computed them)."""
    world, rank = layout.world, layout.rank
    mine = layout.piece_shape(rank)
    if layout.dim is None:
        outgoing = [whole] * world
    else:
        offsets = [0, *itertools.accumulate(chunk_sizes(layout.shape[layout.dim], world))]
        outgoing = [whole.narrow(layout.dim + 1, offsets[o], offsets[o + 1] - offsets[o]) for o in range(world)]
    received = _all_to_all(outgoing, [layout.owned(n, s) * math.prod(mine) for s in range(world)], layout.group)
    out = whole.new_empty((n, *mine))
    for s, flat in enumerate(received):
        out[layout.members(s)] = flat.reshape(layout.owned(n, s), *mine)
    return out


def exchange(pieces: torch.Tensor, layout: Layout,
             matrix_update: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The exchange stage of every matrix algorithm: this rank's pieces [N, *piece] of a megabatch ->
    each whole member assembled on its owner, `matrix_update` run there on the owned members
    [k, *shape], and this rank's pieces of every result back [N, *piece]. A layout that is not a
    1-D `Layout` (optimizers.tensor_parallel.MeshLayout) runs its own exchange."""
    if not isinstance(layout, Layout):
        return layout.exchange(pieces, matrix_update)
    whole = assemble(pieces, layout)
    return scatter(matrix_update(whole), layout, pieces.shape[0])


__all__ = ["Layout", "assemble", "exchange", "chunk_sizes", "layout_of", "local", "placements", "process_group", "scatter",
           "shard_dim"]
