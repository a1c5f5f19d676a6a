"""NorMuon under row sharding on gloo ranks: the same-sharding reference, the variance buffer's
placement, and the refusal of column shards. Rank-side functions live here (spawned ranks import
this module by name)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard

import optimizers
from cases import Case
from harness.runner import run_case
from harness.running.pool import pools
from harness.targets import load_target

SHARDED = "normuon/conv2d-8x4x3x3/mb3/flat/fp32@fp32/pe/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0/shard0/ws3"


def _piece(full: torch.Tensor, ctx, dim: int) -> DTensor:
    size = full.shape[dim]
    chunks = list(torch.chunk(torch.arange(size), ctx.world_size))
    rows = chunks[ctx.rank] if ctx.rank < len(chunks) else torch.arange(0)
    local = full.index_select(dim, rows).clone()
    return DTensor.from_local(local, ctx.mesh, [Shard(dim)], run_check=False, shape=full.shape, stride=full.stride())


def variance_and_refusal(ctx) -> dict[str, str]:
    """Rank side: the variance buffer of a Shard(0) conv, and the error for a Shard(1) conv."""
    full = torch.randn(7, 4, 3, 3, generator=torch.Generator().manual_seed(0))
    p = nn.Parameter(_piece(full, ctx, 0))
    p.grad = _piece(full * 0.5, ctx, 0)
    opt = optimizers.NorMuon([p], flatten=True, mesh=ctx.mesh)
    opt.step()
    v = opt.state[p]["variance"]
    out = {"variance": f"{type(v).__name__} {tuple(v.shape)} {tuple(v.placements)} local {tuple(v.to_local().shape)}"}
    column = nn.Parameter(_piece(full, ctx, 1))
    try:
        optimizers.NorMuon([column], flatten=True, mesh=ctx.mesh)
        out["column"] = "no error"
    except ValueError as exc:
        out["column"] = str(exc)
    return out


def test_variance_is_placed_like_the_parameter_and_column_shards_are_refused():
    result = pools().run("gloo", 3, variance_and_refusal)
    assert result.ok, result.describe()
    for rank, value in enumerate(result.values):
        rows = (3, 3, 1)[rank]
        assert value["variance"] == f"DTensor (7, 1, 1, 1) (Shard(dim=0),) local ({rows}, 1, 1, 1)", value
        assert "sharded on dim 1" in value["column"] and "whole output-channel rows" in value["column"]


def test_row_sharded_normuon_matches_its_same_sharding_reference():
    got = {r.check: r for r in run_case(Case.from_id(SHARDED), load_target("ours"), "ours")}
    assert set(got) == {"reference", "local_shard"}, "no layout-invariance check: the rescale is shard-local"
    assert all(r.status == "pass" for r in got.values()), [(r.check, r.message) for r in got.values()]


def test_row_sharded_kernel_slice_control_is_flagged():
    got = {r.check: r for r in run_case(Case.from_id(SHARDED), load_target("control-normuon-kernel-slice"),
                                         "control-normuon-kernel-slice")}
    assert got["reference"].status == "fail" and got["local_shard"].status == "fail"


def _nordion2_rows(updates, variances, group):
    from optimizers.algorithms.dion2 import normalise_selected_rows
    return normalise_selected_rows(updates, [{"variance": v} for v in variances], group)


def _normuon_rows(updates, variances, group):
    from optimizers.algorithms.normuon import normalise_rows
    return normalise_rows(updates, variances, group)


@pytest.mark.parametrize("normalise", [_normuon_rows, _nordion2_rows], ids=["normuon", "nordion2"])
def test_row_normalisation_bits_do_not_depend_on_the_updates_memory_layout(normalise):
    """One process hands the post-processing stage a tall matrix's update as a transposed view,
    the distributed exchange hands it contiguous: the same values must give the same bits (the
    fp64 layout-invariance check of replicated NorMuon failed by 3 ulp before the stage summed
    on a contiguous copy)."""
    group = dict(flatten=True, beta2=0.95, variance_eps=1e-8)
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        view = torch.randn(2, 8, 40, dtype=torch.float64, generator=generator).mT.reshape(2, 40, 2, 2, 2)
        assert not view.is_contiguous()
        got = [normalise(u, [torch.full((40, 1, 1, 1), 0.5, dtype=torch.float64) for _ in range(2)], group)
               for u in (view, view.contiguous())]
        assert torch.equal(got[0], got[1]), (got[0] - got[1]).abs().max()
