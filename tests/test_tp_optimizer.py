"""Tensor-parallel Muon (optimizers/tensor_parallel.py) on gloo ranks of the harness's pool: real
PyTorch TP (ColwiseParallel / RowwiseParallel) under FSDP2 on a 2-D ("dp", "tp") mesh and on a 1-D
"tp" mesh, both tp_modes, num_heads, uneven and empty shards, and the refusals.

The rank-side functions live here; the spawned ranks import this module by name."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import optimizers
from harness.running.pool import pools
from optimizers.algorithms.muon import orthogonalize_group
from optimizers.matrix_view import lr_scale

HEADS = 4
"""Heads of the q projection below: 16 rows = 4 heads of 4, so TP degrees 2 and 4 keep whole heads."""


class _Block(nn.Module):
    """q (column-parallel, 4 heads), up (column-parallel, 10 rows: uneven over dp x tp, 3+3+3+1 over
    tp 4), down (row-parallel, 10 columns)."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(12, 16, bias=False)
        self.up = nn.Linear(12, 10, bias=False)
        self.down = nn.Linear(10, 12, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # down reads its own (replicated) input: TP's local outputs of an uneven split do not chain
        return self.q(x).square().mean() + self.up(x).square().mean() + self.down(x[:, 2:]).square().mean()


PLAN = {"q": ColwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel(input_layouts=Replicate())}
TP_SPLIT = {"q": 0, "up": 0, "down": 1}


def _muon(model: nn.Module, mesh: object, mode: str, heads: bool) -> optimizers.Muon:
    groups = [{"params": [model.q.weight], "num_heads": HEADS if heads else None},
              {"params": [model.up.weight, model.down.weight]}]
    return optimizers.Muon(groups, lr=0.02, weight_decay=0.1 if mode == "gather" else 0.0, mesh=mesh,
                           tp_mode=mode, compute_dtype=torch.float64)


def _build(ctx, shape: tuple[int, ...], names: tuple[str, ...]) -> tuple[nn.Module, nn.Module, object]:
    """A double-precision block parallelized over a mesh of `shape`: TP on "tp", FSDP2 on "dp" if
    present; and its single-process copy."""
    torch.manual_seed(0)
    model = _Block().double()
    single = copy.deepcopy(model)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    parallelize_module(model, mesh["tp"], PLAN)
    if "dp" in names:
        fully_shard(model, mesh=mesh["dp"])
    return model, single, mesh


def _per_shard_update(full_grad: torch.Tensor, name: str, tp: int, heads: bool) -> tuple[torch.Tensor, float]:
    """The per_shard reference update: each TP shard of the first step's U = G orthogonalized
    alone (per head with heads), and the global shape's lr scale."""
    group = optimizers.Muon([nn.Parameter(torch.zeros(2, 2))], compute_dtype=torch.float64).param_groups[0]
    num_heads = HEADS if heads and name == "q" else None
    pieces = []
    for piece in (p.contiguous() for p in torch.chunk(full_grad, tp, dim=TP_SPLIT[name])):
        if piece.numel() == 0:
            pieces.append(piece)
            continue
        mats = piece.reshape(-1, full_grad.shape[0] // num_heads, piece.shape[1]) if num_heads else piece[None]
        pieces.append(orthogonalize_group(mats, group).reshape(piece.shape))
    return torch.cat(pieces, dim=TP_SPLIT[name]), lr_scale(tuple(full_grad.shape), False, "spectral_norm", num_heads)


def tp_steps(ctx, shape: tuple[int, ...], names: tuple[str, ...], mode: str, heads: bool) -> dict[str, object]:
    """Rank side: real TP (+ FSDP2) forward/backward, then Muon(mesh, tp_mode=mode). gather: 2 steps
    against single-process Muon fed the same gathered gradients (max difference); per_shard: one
    step against `_per_shard_update` (max difference)."""
    model, single, mesh = _build(ctx, shape, names)
    tp = mesh["tp"].size()
    sharded = _muon(model, mesh, mode, heads)
    reference = _muon(single, None, "gather", heads)
    dp_rank = mesh["dp"].get_local_rank() if "dp" in names else 0
    before = {n: p.detach().full_tensor() for n, p in model.named_parameters()}
    diffs = []
    for step in range(2 if mode == "gather" else 1):
        torch.manual_seed(100 * step + dp_rank)
        model(torch.randn(5, 12, dtype=torch.float64)).backward()
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        sharded.step()
        sharded.zero_grad()
        if mode == "gather":
            for (n, _), q in zip(model.named_parameters(), single.parameters()):
                q.grad = grads[n]
            reference.step()
            diffs += [(p.detach().full_tensor() - q.detach()).abs().max().item()
                      for p, q in zip(model.parameters(), single.parameters())]
        else:
            for n, p in model.named_parameters():
                update, scale = _per_shard_update(grads[n], n.split(".")[0], tp, heads)
                expected = before[n].add(update, alpha=-0.02 * scale)
                diffs.append((p.detach().full_tensor() - expected).abs().max().item())
    return {"placements": {n: (str(p.placements), tuple(p.to_local().shape)) for n, p in model.named_parameters()},
            "max_diff": max(diffs),
            "moved": min((p.detach().full_tensor() - before[n]).abs().max().item()
                         for n, p in model.named_parameters())}


@pytest.mark.parametrize("mode", ["gather", "per_shard"])
@pytest.mark.parametrize("heads", [False, True])
def test_fsdp2_x_tp_on_a_2d_mesh(mode, heads):
    """dp 2 x tp 2 at world size 4: gather steps bitwise as one process, per_shard bitwise as its
    same-sharding reference; the FSDP2 x TP placements are the ones torchtitan's composition makes."""
    result = pools().run("gloo", 4, tp_steps, (2, 2), ("dp", "tp"), mode, heads)
    assert result.ok, result.describe()
    for rank, value in enumerate(result.values):
        placements = value["placements"]
        assert "_StridedShard(dim=0" in placements["up.weight"][0], placements
        assert placements["down.weight"][0] == "(Shard(dim=0), Shard(dim=1))", placements
        assert value["moved"] > 0, f"rank {rank}: a parameter did not move"
        assert value["max_diff"] == 0.0, f"rank {rank} ({mode}, heads={heads}): differs by {value['max_diff']}"
    rows = sorted(v["placements"]["up.weight"][1][0] for v in result.values)
    assert rows == [2, 2, 3, 3], f"up.weight rows per rank {rows}: uneven dp pieces expected"


@pytest.mark.parametrize("mode", ["gather", "per_shard"])
def test_tp_alone_on_a_1d_mesh_with_empty_shards(mode):
    """tp 4 on a 1-D "tp" mesh: up.weight's 10 rows are 3+3+3+1, and per_shard with heads keeps
    whole heads (4 rows each)."""
    result = pools().run("gloo", 4, tp_steps, (4,), ("tp",), mode, True)
    assert result.ok, result.describe()
    for rank, value in enumerate(result.values):
        assert value["max_diff"] == 0.0, f"rank {rank} ({mode}): differs by {value['max_diff']}"
    assert sorted(v["placements"]["up.weight"][1][0] for v in result.values) == [1, 3, 3, 3]


def per_head_exactness(ctx) -> dict[str, float]:
    """Rank side: column TP with whole heads; per_shard with num_heads against the single-process
    per-head update, and per_shard without heads against gather (a difference that must show)."""
    out = {}
    for mode, heads in (("per_shard", True), ("per_shard", False)):
        model, single, mesh = _build(ctx, (ctx.world_size,), ("tp",))
        # one process: tp_mode has nothing to shard (its decay follows the mode, as the sharded run's)
        sharded, reference = _muon(model, mesh, mode, heads), _muon(single, None, mode, True)
        torch.manual_seed(7)
        model(torch.randn(5, 12, dtype=torch.float64)).backward()
        single.q.weight.grad = model.q.weight.grad.full_tensor()
        sharded.step()
        reference.step()
        out[f"{mode} heads={heads}"] = (model.q.weight.detach().full_tensor() - single.q.weight.detach()).abs().max().item()
    return out


def test_per_shard_with_heads_equals_unsharded_per_head_bitwise():
    result = pools().run("gloo", 2, per_head_exactness)
    assert result.ok, result.describe()
    got = result.values[0]
    assert got["per_shard heads=True"] == 0.0, got
    assert got["per_shard heads=False"] > 1e-4, f"per_shard without heads should differ from per-head: {got}"


def refusals(ctx) -> dict[str, str]:
    """Rank side: each TP option Muon must refuse, its message, and proof nothing changed."""
    mesh = init_device_mesh("cpu", (ctx.world_size,), mesh_dim_names=("tp",))
    cut = nn.Parameter(distribute_tensor(torch.ones(6, 4), mesh, [Shard(0)]))
    rowwise = nn.Parameter(distribute_tensor(torch.ones(8, 4), mesh, [Shard(1)]))
    builds = {
        "cut heads": lambda: optimizers.Muon([cut], mesh=mesh, tp_mode="per_shard", num_heads=3),
        "row-parallel heads": lambda: optimizers.Muon([rowwise], mesh=mesh, tp_mode="per_shard", num_heads=2),
        "normuon row-parallel": lambda: optimizers.NorMuon([rowwise], mesh=mesh, tp_mode="per_shard"),
        "dion2 per_shard": lambda: optimizers.Dion2([cut], mesh=mesh, tp_mode="per_shard"),
    }
    messages = {}
    for name, build in builds.items():
        try:
            build()
            messages[name] = "no error"
        except (TypeError, ValueError) as exc:
            messages[name] = f"{type(exc).__name__}: {exc}"
    # A step whose group turned invalid after construction raises before any write, on every rank.
    ok = optimizers.Muon([cut], mesh=mesh, tp_mode="gather", num_heads=3)
    cut.grad = distribute_tensor(torch.ones(6, 4), mesh, [Shard(0)])
    ok.param_groups[0]["tp_mode"] = "per_shard"
    try:
        ok.step()
        messages["step"] = "no error"
    except ValueError as exc:
        messages["step"] = f"ValueError: {exc}"
    messages["unchanged"] = str(bool((cut.to_local() == 1).all()) and not ok.state)
    return messages


def test_tp_options_it_cannot_honour_are_refused_before_any_write():
    result = pools().run("gloo", 2, refusals)
    assert result.ok, result.describe()
    for got in result.values:
        assert "cut through heads of 2 rows" in got["cut heads"] and "[3, 3] rows" in got["cut heads"], got
        assert "TP-sharded on dim 1" in got["row-parallel heads"], got
        assert "NorMuon parameter 0" in got["normuon row-parallel"] and "dim 1" in got["normuon row-parallel"], got
        assert "tp_mode='gather'" in got["dion2 per_shard"], got
        assert "cut through heads" in got["step"] and got["unchanged"] == "True", got


def test_num_heads_single_process_is_each_head_alone():
    """One process: a [heads * head_dim, in] parameter with num_heads steps as its head blocks stepped
    as separate parameters, with the head block's lr scale (bitwise, fp64)."""
    torch.manual_seed(0)
    w, g = torch.randn(12, 5, dtype=torch.float64), torch.randn(12, 5, dtype=torch.float64)
    whole = nn.Parameter(w.clone())
    blocks = [nn.Parameter(b.clone()) for b in w.split(4)]
    whole.grad = g.clone()
    for b, gb in zip(blocks, g.split(4)):
        b.grad = gb.clone()
    optimizers.Muon([whole], num_heads=3, compute_dtype=torch.float64, weight_decay=0.1).step()
    optimizers.Muon(blocks, compute_dtype=torch.float64, weight_decay=0.1).step()
    assert torch.equal(whole.detach(), torch.cat([b.detach() for b in blocks]))


@pytest.mark.parametrize("options, message", [
    ({"num_heads": 5}, "does not split into num_heads=5"),
    ({"num_heads": 0}, "num_heads must be a positive integer"),
    ({"tp_mode": "shard"}, "unknown tp_mode 'shard'"),
    ({"algorithm": "normuon", "num_heads": 2}, "NorMuon takes num_heads=None only"),
])
def test_bad_tp_options_raise_naming_the_option(options, message):
    with pytest.raises(ValueError, match=message):
        optimizers.Muon([nn.Parameter(torch.zeros(12, 5))], **options)


def normuon_per_shard(ctx) -> float:
    """Rank side: NorMuon per_shard on a column-parallel weight (10 rows over the "tp" ranks) against
    single-process NorMuon stepping this rank's shard as a parameter of its own (adjust_lr=None, so
    the global and the shard's lr scale agree); returns the largest difference over 2 steps."""
    mesh = init_device_mesh("cpu", (ctx.world_size,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    full, grads = torch.randn(10, 6), [torch.randn(10, 6) for _ in range(2)]
    sharded = nn.Parameter(distribute_tensor(full, mesh, [Shard(0)]))
    alone = nn.Parameter(sharded.to_local().clone())
    options = dict(adjust_lr=None, weight_decay=0.1, nesterov=True)
    tp_opt = optimizers.NorMuon([sharded], mesh=mesh, tp_mode="per_shard", **options)
    one = optimizers.NorMuon([alone], **options)
    worst = 0.0
    for g in grads:
        sharded.grad = distribute_tensor(g, mesh, [Shard(0)])
        alone.grad = sharded.grad.to_local().clone()
        tp_opt.step()
        one.step()
        worst = max(worst, (sharded.to_local() - alone).abs().max().item())
    return worst


def test_normuon_per_shard_is_normuon_on_each_column_parallel_shard():
    result = pools().run("gloo", 2, normuon_per_shard)
    assert result.ok, result.describe()
    assert result.values == [0.0, 0.0], result.values
