"""The layout axis: how a case's parameters lie on the ranks of a distributed run.

  single      one process (the default; its ids carry no layout tokens)
  replicated  every rank holds every parameter whole (DDP)
  shard0      DTensor Shard(0) on a 1-D mesh, as FSDP2 shards parameters
  shard1      DTensor Shard(1)

Shards split like torch.chunk: ceil(size/W) per rank, the last ranks smaller or empty.
Whether a sharded layout is even, uneven or has empty shards follows from the shape and
the world size; `detail` names it. The split is written out here again, independently
of optimizers/distributed.py, because it is part of the specification cases are built on.

A distributed case id ends in two more tokens, `/<layout>/ws<W>`.
"""

from __future__ import annotations

LAYOUTS = ("single", "replicated", "shard0", "shard1")
DISTRIBUTED = LAYOUTS[1:]
CI_WORLD_SIZES = (2, 3, 4)
NIGHTLY_WORLD_SIZES = (2, 3, 4, 5, 6, 7, 8)
"""Every world size up to 8, so that a machine of any GPU count up to 8 has cases at its full size."""
CI_LAYERS = ("linear", "linear_row", "conv1d", "conv2d", "conv3d")
"""With world sizes 2-4 these give even, uneven and empty shards on both dims: e.g. conv2d (8 rows)
over 3 ranks is 3+3+2, conv3d (6 rows) over 4 is 2+2+2+0, linear_row (1 row) always has empty shards,
and Shard(1) of conv2d (4 input channels) over 3 ranks is 2+2+0."""


def shard_dim(layout: str) -> int | None:
    """The sharded dim of `layout`, None for single and replicated."""
    return int(layout.removeprefix("shard")) if layout.startswith("shard") else None


def piece_sizes(size: int, world_size: int) -> list[int]:
    """What torch.chunk gives each rank of a dim of `size`: ceil(size/W), the last ranks less or 0."""
    step = -(-size // world_size)
    return [max(0, min(step, size - r * step)) for r in range(world_size)]


def invalid(layout: str, world_size: int) -> str | None:
    """Why (layout, world_size) is not a valid pair, or None."""
    if layout not in LAYOUTS:
        return f"layout {layout!r} is not one of {LAYOUTS}"
    if (layout == "single") != (world_size == 1) or world_size < 1:
        return f"layout {layout!r} with world size {world_size}: single means 1, distributed layouts need 2+"
    return None


def detail(layout: str, world_size: int, shape: tuple[int, ...]) -> str:
    """single, replicated, or shard<d>-even / -uneven / -empty for this shape and world size."""
    dim = shard_dim(layout)
    if dim is None:
        return layout
    sizes = piece_sizes(shape[dim], world_size)
    kind = "empty" if 0 in sizes else "even" if len(set(sizes)) == 1 else "uneven"
    return f"{layout}-{kind}"


def id_tokens(layout: str, world_size: int) -> list[str]:
    """The id tokens of a layout: none for single, else [layout, ws<W>]."""
    return [] if layout == "single" else [layout, f"ws{world_size}"]


def parse_tokens(tokens: list[str]) -> dict[str, object]:
    """Inverse of `id_tokens` (ValueError on a malformed world size)."""
    if not tokens:
        return {}
    layout, ws = tokens
    if not ws.startswith("ws"):
        raise ValueError(f"world size token {ws!r} must read ws<W>")
    return {"layout": layout, "world_size": int(ws.removeprefix("ws"))}
