"""Dion2 / NorDion2 on gloo ranks: the global scope equals the unsharded step under every layout,
the local scope its same-sharding reference (its layout dependence measured, not judged).
Rank-side functions live here (spawned ranks import this module by name)."""

import pytest
import torch
from torch.distributed.tensor import DTensor, Shard

import optimizers
from cases import Case
from harness.runner import run_case
from harness.running.pool import pools
from harness.targets import load_target

TAIL = "/fp32@fp32/pe/spectral_norm/plain/wd0.1/steps3/gaussian/seed0"
CASES = {
    "global-rows": "dion2-f0.25-global/conv2d-8x4x3x3/mb2/flat" + TAIL + "/shard0/ws3",
    "global-columns": "dion2-f0.5-global/conv2d_tall-40x2x2x2/mb3/flat" + TAIL + "/shard1/ws2",
    "local-rows": "dion2-f0.25-local/conv2d-8x4x3x3/mb2/flat" + TAIL + "/shard0/ws3",
    "nordion2-rows": "nordion2-f0.25-global/conv3d-6x3x2x3x3/mb2/flat" + TAIL + "/shard0/ws4",
    "nordion2-replicated": "nordion2-f0.5-local/conv2d-8x4x3x3/mb3/flat" + TAIL + "/replicated/ws2",
}


@pytest.mark.parametrize("name", CASES)
def test_distributed_dion2_passes_every_check(name):
    case = Case.from_id(CASES[name])
    records = {r.check: r for r in run_case(case, load_target("ours"), "ours")}
    assert all(r.status == "pass" for r in records.values()), [(r.check, r.status, r.message) for r in records.values()]
    if name.startswith("global"):
        assert records["layout"].ratio == 0.0  # bitwise the single-process step
    if name == "local-rows":
        assert "layout" not in records and "layout dependence of the local selection scope" in \
            records["reference"].message


def nordion2_column_shard(ctx) -> str:
    """Rank side: NorDion2 over a Shard(1) parameter must be refused at construction."""
    full = torch.zeros(8, 4, 3, 3)
    piece = full.chunk(ctx.world_size, dim=1)[ctx.rank].clone()
    p = torch.nn.Parameter(DTensor.from_local(piece, ctx.mesh, [Shard(1)], run_check=False, shape=full.shape,
                                              stride=full.stride()))
    try:
        optimizers.NorDion2([p], flatten=True, mesh=ctx.mesh)
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_nordion2_refuses_a_column_shard_at_construction():
    result = pools().run("gloo", 2, nordion2_column_shard)
    assert result.ok, result.describe()
    assert all("NorDion2 parameter 0" in v and "sharded on dim 1" in v for v in result.values), result.values
