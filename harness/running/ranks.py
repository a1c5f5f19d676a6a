"""What each rank of a distributed case runs: the case's parameters and gradients laid out as the case
says (whole, a torch.chunk piece as a DTensor Shard(d), or a piece of a tensor-parallel layout on a named
"tp" or ("dp", "tp") mesh: cases/layouts.py), stepped with the target's distributed optimizer
(`make_distributed(params, case, mesh)`); each rank returns its own piece of every member after every step.
Every rank rebuilds the case's inputs (deterministic)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from cases import Case
from cases.layouts import regions, shard_dim
from harness.running.guard import kept_torch_state
from harness.running.inputs import make_inputs
from harness.running.pool import RankContext
from harness.targets import load_target
from harness.targets.base import distributed_maker, step_through

Trajectory = list[list[torch.Tensor]]


def mesh_of(case: Case, ctx: RankContext) -> DeviceMesh:
    """The mesh a case's parameters live on: the pool's 1-D mesh, or for a TP layout a named "tp"
    (or ("dp", "tp")) mesh over the same ranks, made once per rank and kept."""
    tp = case.tensor_parallel
    if tp is None:
        return ctx.mesh
    if tp.dp == 1:
        return DeviceMesh.from_group(ctx.group, ctx.device.type, mesh_dim_names=("tp",))
    if ctx.world_size != dist.get_world_size():
        raise RuntimeError(f"a ({tp.dp}, tp) mesh of {ctx.world_size} ranks is built over the whole job; run "
                           f"it with {ctx.world_size} processes (torchrun --nproc-per-node {ctx.world_size})")
    key = f"mesh-dp{tp.dp}"
    if key not in ctx.cache:
        ctx.cache[key] = init_device_mesh(ctx.device.type, (tp.dp, tp.degree(ctx.world_size)),
                                          mesh_dim_names=("dp", "tp"))
    return ctx.cache[key]


def _placements(case: Case) -> list:
    """The DTensor placements of a sharded layout: Shard(d); TP: Shard(d) on "tp", and under "dp"
    FSDP2's placement of a TP shard (_StridedShard(0) over a column-parallel split, Shard(0) else)."""
    tp = case.tensor_parallel
    if tp is None:
        return [Shard(shard_dim(case.layout))]
    if tp.dp == 1:
        return [Shard(tp.dim)]
    degree = tp.degree(case.world_size)
    return [_StridedShard(0, split_factor=degree) if tp.dim == 0 else Shard(0), Shard(tp.dim)]


def _place(full: torch.Tensor, case: Case, ctx: RankContext) -> torch.Tensor:
    """This rank's copy of `full`: itself (replicated), or its piece (cases.layouts.regions) as a DTensor."""
    full = full.to(ctx.device)
    if case.layout == "replicated":
        return full.clone()
    piece = full[regions(case.layout, case.world_size, case.shape)[ctx.rank]].clone()
    return DTensor.from_local(piece, mesh_of(case, ctx), _placements(case), run_check=False, shape=full.shape,
                              stride=full.stride())


def rank_trajectory(ctx: RankContext, case_id: str, target_spec: str) -> Trajectory:
    """Rank side: step the case's parameters, laid out as the case says, with the target's
    distributed optimizer (harness.targets.base.step_through); returns this rank's piece of every
    member after every step (CPU)."""
    case = Case.from_id(case_id)
    if target_spec not in ctx.cache:
        ctx.cache[target_spec] = load_target(target_spec)
    maker = distributed_maker(ctx.cache[target_spec])
    assert maker is not None, "unsupported targets never reach the ranks"
    mesh = mesh_of(case, ctx)
    inputs = make_inputs(case)
    trajectory = step_through(lambda params, case: maker(params, case, mesh), inputs.params, inputs.grads, case,
                              lambda full: _place(full, case, ctx))
    return [[piece.to("cpu") for piece in step] for step in trajectory]


def rank_case(ctx: RankContext, case_id: str, target_spec: str) -> tuple[Trajectory, list[str]]:
    """`rank_trajectory` with torch's global settings and RNG states restored afterwards (ranks run case
    after case): the trajectory, and the settings the target changed on this rank (harness/running/guard.py)."""
    with kept_torch_state() as changed:
        trajectory = rank_trajectory(ctx, case_id, target_spec)
    return trajectory, changed
