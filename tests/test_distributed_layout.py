"""optimizers/distributed.py on gloo pools of three and four ranks: member j of a megabatch is
orthogonalized on rank (start + j) mod W, so that successive megabatches spread over every rank;
`layout_of` refuses a DTensor whose local shards are not torch.chunk's pieces, larger or smaller;
`zeros_placed_like` keeps a parameter's shape and memory format. The rank-side functions live here
(spawned ranks import this module by name)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.distributed.tensor import DTensor, Shard

from harness.running.pool import SpawnedPools
from optimizers import distributed

SHAPE = (6, 4)


def owners_seen(ctx, start: int, n: int, dim: int | None) -> list[int]:
    """The members whose whole matrices this rank's `exchange` hands to the update, read from their
    values (member j is filled with j), for a megabatch of `n` 6 x 4 members (replicated: laid out by
    `layout_of`, which reduces `start` mod W)."""
    whole = torch.arange(n, dtype=torch.float64).reshape(n, 1, 1).expand(n, *SHAPE).contiguous()
    if dim is None:
        pieces, layout = whole, distributed.layout_of(torch.zeros(SHAPE), ctx.group, start)
    else:
        sizes = distributed.chunk_sizes(SHAPE[dim], ctx.world_size)
        pieces = whole.split(sizes, dim=dim + 1)[ctx.rank].contiguous()
        layout = distributed.Layout(ctx.group, SHAPE, dim, start % ctx.world_size)
    seen: list[int] = []

    def update(members: torch.Tensor) -> torch.Tensor:
        assert members.shape[1:] == SHAPE
        seen.extend(int(m[0, 0]) for m in members)
        return members

    back = distributed.exchange(pieces, layout, update)
    assert torch.equal(back, pieces)
    return seen


def refuses_rows(ctx, rows: list[int]) -> str:
    """layout_of of a Shard(0) DTensor of 6 x 4 whose rank r holds rows[r] rows: the error, or "accepted"."""
    local = torch.zeros(rows[ctx.rank], 4)
    p = DTensor.from_local(local, ctx.mesh, [Shard(0)], run_check=False, shape=torch.Size(SHAPE), stride=(4, 1))
    try:
        distributed.layout_of(p, ctx.group, 0)
    except ValueError as exc:
        return str(exc)
    return "accepted"


@pytest.fixture(scope="module")
def pools():
    own = SpawnedPools()
    yield own
    own.close()


@pytest.mark.parametrize("world,dim", [(3, None), (4, None), (3, 0), (3, 1)])
def test_member_j_is_owned_by_rank_start_plus_j_mod_world(pools, world, dim):
    """(rank - start) mod W made (rank + start) mod W relabels the owners and exchanges the same values, and a
    start reduced otherwise than mod W (start ** W agrees with it mod a prime W, not mod 4) still leaves each member
    one owner: no case, each of one megabatch starting at 0, can tell; the contract that spreads megabatches is
    checked here, starts past W included."""
    for start in range(2 * world):
        result = pools.run("gloo", world, owners_seen, start, 5, dim)
        assert result.ok, result.describe()
        want = [[j for j in range(5) if (start + j) % world == rank] for rank in range(world)]
        assert result.values == want, f"start={start}: ranks updated {result.values}, want {want}"


def test_a_shard_that_is_not_torch_chunks_piece_is_refused_on_the_rank_holding_it(pools):
    """Rows (1, 2, 3) of 6 over three ranks, where torch.chunk gives (2, 2, 2): rank 0's piece is smaller and rank
    2's larger; both refuse, naming the piece they expected, and rank 1's, which is the chunk piece, is accepted."""
    result = pools.run("gloo", 3, refuses_rows, [1, 2, 3])
    assert result.ok, result.describe()
    small, middle, large = result.values
    assert "holds (1, 4), expected the torch.chunk piece (2, 4)" in small
    assert middle == "accepted"
    assert "holds (3, 4), expected the torch.chunk piece (2, 4)" in large


def test_zeros_placed_like_a_plain_parameter_keep_its_memory_format_or_take_the_shape_asked():
    p = torch.randn(8, 4, 3, 3).to(memory_format=torch.channels_last)
    same = distributed.zeros_placed_like(p, tuple(p.shape))
    assert same.shape == p.shape and same.is_contiguous(memory_format=torch.channels_last) and not same.any()
    for shape in [(8, 1, 1, 1), (8, 5, 3, 3)]:  # smaller, and larger along a trailing dim
        assert distributed.zeros_placed_like(p, shape).shape == shape


def test_a_layout_is_frozen():
    layout = distributed.Layout(None, SHAPE, None, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.start = 1
