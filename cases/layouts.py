"""The layout axis: how a case's parameters lie on the ranks of a distributed run.

  single      one process (the default; its ids carry no layout tokens)
  replicated  every rank holds every parameter whole (DDP)
  shard0      DTensor Shard(0) on a 1-D mesh, as FSDP2 shards parameters
  shard1      DTensor Shard(1)

Shards split like torch.chunk: ceil(size/W) per rank, the last ranks smaller or empty.
Whether a sharded layout is even, uneven or has empty shards follows from the shape and
the world size; `detail` names it. The split is written out here again, independently
of optimizers/distributed.py, because it is part of the specification cases are built on.

A distributed case id ends in two more tokens, `/<layout>/ws<W>` (cases/schema.py).

Tensor-parallel layouts (2-D parameters; optimizers/tensor_parallel.py) read

  tp<d>-<mode>[-h<H>]        a 1-D mesh named "tp" of W ranks, the weight placed Shard(d):
                             d = 0 column-parallel (ColwiseParallel), d = 1 row-parallel (RowwiseParallel)
  dp<D>tp<d>-<mode>[-h<H>]   a 2-D ("dp", "tp") mesh of D x W/D ranks: the TP split of dim d into W/D
                             torch.chunk pieces, each piece's dim 0 split again over "dp" (FSDP2 over
                             TP, as torchtitan composes them)

with the TP mode (`gather` or `per_shard`) and, with `-h<H>`, H attention heads (num_heads). The
mode and the heads ride in the layout token because they decide which FP64 reference the case has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LAYOUTS = ("single", "replicated", "shard0", "shard1")
DISTRIBUTED = LAYOUTS[1:]
CI_WORLD_SIZES = (2, 3, 4)
NIGHTLY_WORLD_SIZES = (2, 3, 4, 5, 6, 7, 8)
"""Every world size up to 8, so that a machine of any GPU count up to 8 has cases at its full size."""
CI_LAYERS = ("linear", "linear_row", "conv1d", "conv2d", "conv3d")
"""With world sizes 2-4 these give even, uneven and empty shards on both dims: e.g. conv2d (8 rows)
over 3 ranks is 3+3+2, conv3d (6 rows) over 4 is 2+2+2+0, linear_row (1 row) always has empty shards,
and Shard(1) of conv2d (4 input channels) over 3 ranks is 2+2+0."""


TP_MODES = ("gather", "per_shard")
_TP = re.compile(r"(?:dp(\d+))?tp([01])-(gather|per_shard)(?:-h(\d+))?")


@dataclass(frozen=True)
class TensorParallel:
    """A TP layout: `dp` ranks of FSDP2 (1: none), TP split of `dim`, `mode`, `heads` (None: whole matrices)."""

    dp: int
    dim: int
    mode: str
    heads: int | None

    def token(self) -> str:
        return (f"dp{self.dp}" if self.dp > 1 else "") + f"tp{self.dim}-{self.mode}" + \
            (f"-h{self.heads}" if self.heads else "")

    def degree(self, world_size: int) -> int:
        """The TP degree: the size of the "tp" mesh dim."""
        return world_size // self.dp


def tensor_parallel(layout: str) -> TensorParallel | None:
    """The TP layout `layout` names, None for the other layouts."""
    match = _TP.fullmatch(layout)
    if match is None:
        return None
    dp, dim, mode, heads = match.groups()
    tp = TensorParallel(int(dp) if dp else 1, int(dim), mode, int(heads) if heads else None)
    return tp if tp.token() == layout else None  # canonical spellings only (no dp1, h0, leading zeros)


def tp_invalid(tp: TensorParallel, world_size: int, shape: tuple[int, ...]) -> str | None:
    """Why a TP layout cannot hold a parameter of `shape` on `world_size` ranks, or None."""
    if len(shape) != 2:
        return f"tensor-parallel layouts are for 2-D weights, not {shape}"
    if world_size % tp.dp or world_size // tp.dp < 2:
        return f"dp {tp.dp} x tp needs a world size that is a multiple of {tp.dp} with tp >= 2, got {world_size}"
    if tp.heads is not None:
        if tp.heads < 1 or shape[0] % tp.heads:
            return f"{shape[0]} rows do not split into {tp.heads} heads"
        head_dim = shape[0] // tp.heads
        if tp.mode == "per_shard" and (tp.dim != 0 or any(
                n % head_dim for n in piece_sizes(shape[0], tp.degree(world_size)))):
            return "per_shard with heads needs column-parallel TP shards holding whole heads"
    return None


def regions(layout: str, world_size: int, shape: tuple[int, ...]) -> list[tuple[slice, ...]]:
    """Each rank's piece of a parameter of `shape` as index slices (a box: every layout's pieces are
    contiguous blocks): whole when replicated; the torch.chunk piece of dim d for shard<d>; for a TP
    layout, rank r = i * tp + j (dp index i, tp index j) holds tp piece j of dim d, its dim 0 cut
    again into dp pieces, piece i."""
    whole = [slice(None)] * len(shape)
    dim, tp = shard_dim(layout), tensor_parallel(layout)
    out = []
    for r in range(world_size):
        index = list(whole)
        if dim is not None:
            lo = sum(piece_sizes(shape[dim], world_size)[:r])
            index[dim] = slice(lo, lo + piece_sizes(shape[dim], world_size)[r])
        elif tp is not None:
            degree = tp.degree(world_size)
            i, j = divmod(r, degree)
            sizes = piece_sizes(shape[tp.dim], degree)
            lo = sum(sizes[:j])
            index[tp.dim] = slice(lo, lo + sizes[j])
            rows = index[0].stop - index[0].start if tp.dim == 0 else shape[0]
            base = index[0].start if tp.dim == 0 else 0
            inner = piece_sizes(rows, tp.dp)
            index[0] = slice(base + sum(inner[:i]), base + sum(inner[:i]) + inner[i])
        out.append(tuple(index))
    return out


def shard_dim(layout: str) -> int | None:
    """The sharded dim of `layout`, None for single and replicated."""
    return int(layout.removeprefix("shard")) if layout.startswith("shard") else None


def piece_sizes(size: int, world_size: int) -> list[int]:
    """What torch.chunk gives each rank of a dim of `size`: ceil(size/W), the last ranks less or 0."""
    step = -(-size // world_size)
    return [max(0, min(step, size - r * step)) for r in range(world_size)]


def invalid(layout: str, world_size: int) -> str | None:
    """Why (layout, world_size) is not a valid pair, or None."""
    if layout not in LAYOUTS and tensor_parallel(layout) is None:
        return f"layout {layout!r} is not one of {LAYOUTS} nor a tensor-parallel layout (tp<d>-<mode>[-h<H>])"
    if (layout == "single") != (world_size == 1) or world_size < 1:
        return f"layout {layout!r} with world size {world_size}: single means 1, distributed layouts need 2+"
    return None


def detail(layout: str, world_size: int, shape: tuple[int, ...]) -> str:
    """single, replicated, or shard<d>-even / -uneven / -empty for this shape and world size (a TP
    layout: its token and its TP pieces' kind)."""
    dim, tp = shard_dim(layout), tensor_parallel(layout)
    if tp is not None:
        sizes = piece_sizes(shape[tp.dim], tp.degree(world_size))
    elif dim is None:
        return layout
    else:
        sizes = piece_sizes(shape[dim], world_size)
    kind = "empty" if 0 in sizes else "even" if len(set(sizes)) == 1 else "uneven"
    return f"{layout}-{kind}"
