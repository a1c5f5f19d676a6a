"""Distributed Muon on gloo ranks of the harness's pool: real FSDP2, layouts it must refuse,
and the equality of the distributed step with the single-process one.

The rank-side functions live here; the spawned ranks import this module by name (pytest
puts tests/ on sys.path, which spawned processes inherit)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Partial, Shard

import optimizers
from harness.running.pool import pools


class _Net(nn.Module):
    """Conv1d, Conv2d, Conv3d and Linear branches; 5 and 7 output rows shard unevenly (and
    with an empty shard over 4 ranks)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv1d(3, 5, 3), nn.Conv2d(3, 7, 3)
        self.c3, self.fc = nn.Conv3d(2, 5, 2), nn.Linear(9, 5)

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        layers = (self.c1, self.c2, self.c3, self.fc)
        return sum(layer(x).float().square().mean() for layer, x in zip(layers, xs))


def _inputs(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for shape in ((4, 3, 10), (4, 3, 6, 6), (4, 2, 4, 4, 4), (4, 9))]


def _muon(model: nn.Module, mesh: object) -> optimizers.Muon:
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    vectors = [p for p in model.parameters() if p.ndim < 2]
    return optimizers.Muon([{"params": matrices}, {"params": vectors, "algorithm": "adamw"}], lr=0.02,
                           nesterov=True, weight_decay=0.1, flatten=True, mesh=mesh)


def fsdp2_steps(ctx, steps: int) -> dict[str, object]:
    """Rank side: FSDP2 (bf16 compute, fp32 parameters) forward/backward then Muon(mesh) for `steps`
    steps; alongside, single-process Muon fed the same gathered gradients. Returns the placements
    seen and the largest difference between the two parameter sets."""
    torch.manual_seed(0)
    model = _Net()
    single = copy.deepcopy(model)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in (model.c1, model.c2, model.c3, model.fc):
        fully_shard(layer, mesh=ctx.mesh, mp_policy=policy)
    fully_shard(model, mesh=ctx.mesh, mp_policy=policy)
    sharded, reference = _muon(model, ctx.mesh), _muon(single, None)
    for step in range(steps):
        model(_inputs(100 * step + ctx.rank)).backward()
        for (_, p), q in zip(model.named_parameters(), single.parameters()):
            q.grad = p.grad.full_tensor()
        sharded.step()
        reference.step()
        sharded.zero_grad()
    return {
        "placements": {n: (type(p).__name__, str(p.placements), str(p.dtype), tuple(p.to_local().shape))
                       for n, p in model.named_parameters()},
        "max_diff": max((p.full_tensor() - q).abs().max().item()
                        for p, q in zip(model.parameters(), single.parameters())),
    }


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_fsdp2_step_equals_single_process_step(world_size):
    result = pools().run("gloo", world_size, fsdp2_steps, 2)
    assert result.ok, result.describe()
    for rank, value in enumerate(result.values):
        placements = value["placements"]
        assert all(kind == "DTensor" and "Shard(dim=0)" in pl and dtype == "torch.float32"
                   for kind, pl, dtype, _ in placements.values()), placements
        # Same gathered gradients, same orthogonalized matrices: the steps agree bitwise.
        assert value["max_diff"] == 0.0, f"rank {rank}: FSDP2 Muon differs from one process by {value['max_diff']}"
    local_rows = [v["placements"]["c1.weight"][3][0] for v in result.values]
    assert sum(local_rows) == 5 and len(set(local_rows)) > 1, f"c1.weight rows per rank {local_rows}: uneven expected"


def refusals(ctx) -> dict[str, str]:
    """Rank side: the message of every layout Muon must refuse at construction, and proof that no
    parameter changed."""
    messages = {}
    flat = torch.nn.Parameter(torch.randn(4, 6))
    before = flat.detach().clone()
    mesh2d = init_device_mesh("cpu", (ctx.world_size, 1))
    partial = DTensor.from_local(torch.randn(4, 6), ctx.mesh, [Partial()], shape=torch.Size((4, 6)), stride=(6, 1))
    cases = {
        "2-D mesh": lambda: optimizers.Muon([flat], mesh=mesh2d),
        "partial": lambda: optimizers.Muon([nn.Parameter(partial)], mesh=ctx.mesh),
        "DTensor without a mesh": lambda: optimizers.Muon([nn.Parameter(
            DTensor.from_local(torch.randn(2, 6), ctx.mesh, [Shard(0)], shape=torch.Size((2 * ctx.world_size, 6)),
                               stride=(6, 1)))]),
        "not a mesh": lambda: optimizers.Muon([flat], mesh="gloo"),
    }
    for name, build in cases.items():
        try:
            build()
            messages[name] = "no error"
        except (TypeError, ValueError) as exc:
            messages[name] = f"{type(exc).__name__}: {exc}"
    messages["unchanged"] = str(torch.equal(flat.detach(), before))
    # A shard split other than torch.chunk's is refused at the step, before anything changes.
    rows = 2 if ctx.rank == 0 else 6
    odd = nn.Parameter(DTensor.from_local(torch.ones(rows, 3), ctx.mesh, [Shard(0)], shape=torch.Size((8, 3)),
                                          stride=(3, 1)))
    odd.grad = DTensor.from_local(torch.ones(rows, 3), ctx.mesh, [Shard(0)], shape=torch.Size((8, 3)), stride=(3, 1))
    try:
        optimizers.Muon([odd], mesh=ctx.mesh).step()
        messages["odd split"] = "no error"
    except ValueError as exc:
        messages["odd split"] = f"ValueError: {exc}"
    messages["odd split unchanged"] = str(bool((odd.to_local() == 1).all()))
    return messages


def test_unsupported_layouts_are_refused_with_clear_errors():
    result = pools().run("gloo", 2, refusals)
    assert result.ok, result.describe()
    got = result.values[0]
    assert "2-D DeviceMesh" in got["2-D mesh"] and "mesh_dim_names" in got["2-D mesh"]
    assert "placement P(sum)" in got["partial"] and "Shard(d), Replicate()" in got["partial"]
    assert "pass Muon(mesh=...)" in got["DTensor without a mesh"]
    assert got["not a mesh"].startswith("TypeError") and "ProcessGroup or a DeviceMesh" in got["not a mesh"]
    assert got["unchanged"] == "True"
    assert "expected the torch.chunk piece" in got["odd split"] and got["odd split unchanged"] == "True"


def group_and_mesh(ctx) -> bool:
    """Rank side: Muon(mesh=ProcessGroup) and Muon(mesh=DeviceMesh) step replicated parameters
    identically, and every rank ends with the same bytes."""
    torch.manual_seed(0)
    start = [torch.randn(6, 4, 3) for _ in range(5)]
    params = [[nn.Parameter(x.clone()) for x in start] for _ in range(2)]
    grads = [torch.randn(6, 4, 3) for _ in range(5)]
    for ps, mesh in zip(params, (ctx.group, ctx.mesh)):
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        optimizers.Muon(ps, flatten=True, mesh=mesh).step()
    same = all(torch.equal(a, b) for a, b in zip(*params))
    gathered = [torch.empty(5, 6, 4, 3) for _ in range(ctx.world_size)]
    torch.distributed.all_gather(gathered, torch.stack([p.detach() for p in params[0]]), group=ctx.group)
    return same and all(torch.equal(gathered[0], g) for g in gathered)


@pytest.mark.parametrize("world_size", [2, 3])
def test_process_group_and_device_mesh_agree_and_replicas_are_bitwise_equal(world_size):
    result = pools().run("gloo", world_size, group_and_mesh)
    assert result.ok, result.describe()
    assert all(result.values)


def disagreements(ctx) -> dict[str, str]:
    """Rank side: ranks that step different parameter sets, or a rank that rejects its step, make every
    rank raise before any rank writes (no hang, nothing changed); the first step after a good one
    (a cached plan) is checked too."""
    out: dict[str, str] = {}

    def params(shapes, seed=0):
        g = torch.Generator().manual_seed(seed)
        ps = [nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]
        for p in ps:
            p.grad = torch.randn(*p.shape, generator=g)
        return ps

    def attempt(name, ps, opt):
        before = [p.detach().clone() for p in ps]
        state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
        try:
            opt.step()
            out[name] = "no error"
        except (TypeError, ValueError) as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
        same_state = state.keys() == {id(p) for p in opt.state} and all(
            torch.equal(v, opt.state[p][k]) for p in opt.state for k, v in state[id(p)].items())
        out[name + " unchanged"] = str(all(torch.equal(a, p) for a, p in zip(before, ps)) and same_state)

    ps = params([(4, 6)] * 3)
    if ctx.rank == 1:
        ps[1].grad = None
    attempt("grad None on one rank", ps, optimizers.Muon(ps, mesh=ctx.mesh))
    ps = params([(4, 6), (4, 6) if ctx.rank == 0 else (5, 6), (3, 3)])
    attempt("shape mismatch", ps, optimizers.Muon(ps, mesh=ctx.mesh))
    ps = params([(4, 6)] * 2)
    opt = optimizers.Muon(ps, mesh=ctx.mesh)
    opt.step()
    if ctx.rank == 1:
        ps[0].grad = None
    attempt("grad None after a cached step", ps, opt)
    ps = params([(4, 6)] * 2)
    opt = optimizers.Muon(ps, mesh=ctx.mesh)
    if ctx.rank == 1:
        opt.param_groups[0]["lr"] = float("nan")
    attempt("rejected on one rank", ps, opt)
    return out


def test_ranks_that_disagree_all_raise_before_any_rank_writes():
    result = pools().run("gloo", 2, disagreements)
    assert result.ok, result.describe()
    first, second = result.values
    for name in ("grad None on one rank", "shape mismatch", "grad None after a cached step"):
        assert first[name] == second[name], name  # the same ValueError on every rank
        assert first[name].startswith("ValueError: ranks step different parameter sets"), first[name]
        assert first[name + " unchanged"] == second[name + " unchanged"] == "True", name
    assert "param group 0 parameter 1" in first["grad None on one rank"] and "without a gradient" in \
        first["grad None on one rank"]
    assert "(4, 6)" in first["shape mismatch"] and "(5, 6)" in first["shape mismatch"]
    assert "parameter 0" in first["grad None after a cached step"]
    assert second["rejected on one rank"].startswith("ValueError: param group 0: lr must be finite")
    assert first["rejected on one rank"].startswith("ValueError: rank 1 rejected this step")
    assert first["rejected on one rank unchanged"] == second["rejected on one rank unchanged"] == "True"
