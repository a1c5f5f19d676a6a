"""The ownership contract of optimizers/distributed.py on a gloo pool of three ranks: member j of a
megabatch is orthogonalized on rank (start + j) mod W, so that successive megabatches spread over
every rank. The rank-side functions live here (spawned ranks import this module by name)."""

from __future__ import annotations

import pytest
import torch

from harness.running.pool import SpawnedPools
from optimizers import distributed

WORLD = 3


def owners_seen(ctx, start: int, n: int, dim: int | None) -> list[int]:
    """The members whose whole matrices this rank's `exchange` hands to the update, read from their
    values (member j is filled with j), for a megabatch of `n` 6 x 4 members."""
    whole = torch.arange(n, dtype=torch.float64).reshape(n, 1, 1).expand(n, 6, 4).contiguous()
    if dim is None:
        pieces = whole
    else:
        sizes = distributed.chunk_sizes((6, 4)[dim], WORLD)
        pieces = whole.split(sizes, dim=dim + 1)[ctx.rank].contiguous()
    layout = distributed.Layout(ctx.group, (6, 4), dim, start)
    seen: list[int] = []

    def update(members: torch.Tensor) -> torch.Tensor:
        assert members.shape[1:] == (6, 4)
        seen.extend(int(m[0, 0]) for m in members)
        return members

    back = distributed.exchange(pieces, layout, update)
    assert torch.equal(back, pieces)
    return seen


@pytest.fixture(scope="module")
def pools():
    own = SpawnedPools()
    yield own
    own.close()


@pytest.mark.parametrize("dim", [None, 0, 1])
def test_member_j_is_owned_by_rank_start_plus_j_mod_world(pools, dim):
    """(rank - start) mod W made (rank + start) mod W relabels the owners and exchanges the same values,
    so no case can tell; the contract that spreads megabatches is checked here."""
    for start in range(WORLD):
        result = pools.run("gloo", WORLD, owners_seen, start, 5, dim)
        assert result.ok, result.describe()
        want = [[j for j in range(5) if (start + j) % WORLD == rank] for rank in range(WORLD)]
        assert result.values == want, f"start={start}: ranks updated {result.values}, want {want}"
