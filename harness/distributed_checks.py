"""A case over its layout: what each rank runs, and the checks the parent judges from what came back.

One process is the layout of world size 1: its one piece is the whole trajectory and it gets the
single-process checks (harness/checks.py) through `check`. Whose optimizer runs is the target's
business alone: every target builds it with `make_distributed(params, case, mesh)`.

Every rank rebuilds the case's inputs (deterministic), lays the parameters and gradients
out as the case says (whole, its torch.chunk piece as a DTensor Shard(d), or its piece of a
tensor-parallel layout on a named "tp" or ("dp", "tp") mesh: cases/layouts.py), steps them
with the target's distributed optimizer and returns its own piece of every member after
every step. The parent gathers the pieces (each into its box, cases.layouts.regions) and judges:

  reference    gathered parameters vs the FP64 reference step, re-seeded every step from the
               gathered previous parameter (harness.checks.reference, unchanged); a Dion2 case of
               the local selection scope also MEASURES (reports, never judges) how far its update
               is from the global-scope one: the layout dependence of that scope
  local_shard  the same-sharding reference: each rank's own piece vs the same piece of that
               reference step, so an error confined to one shard cannot hide in the whole's norm;
               allowed the whole's error allowance relative to the piece (`piece_tolerance`)
               (a TP case's reference is its mode's: the whole matrix for gather, each TP shard
               alone for per_shard, per head with heads; harness/algorithms.py)
  layout       layout invariance: the gathered run vs the single-process run of the same case
               on the same target (bitwise when the target's relations are exact and all is fp64);
               for per_shard TP with heads, per-head exactness (each TP shard's whole heads equal
               the unsharded per-head update)
  replicas     replicated layout: every rank's parameters are bitwise those of rank 0
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from cases import Case
from cases.layouts import regions, shard_dim
from harness import checks, tolerance
from harness.algorithms import algorithm, selection_blocks
from harness.checks import Outcome, Trajectory
from harness.inputs import Inputs, f64, make_inputs
from harness.metrics import compare_step
from harness.pool import RankContext
from harness.targets import load_target
from harness.targets.base import Target, step_through

Pieces = list[Trajectory]
"""pieces[r][k][i]: rank r's piece of member i after step k."""

Maker = Callable[[list[torch.nn.Parameter], Case, Any], torch.optim.Optimizer]

REPLICAS = tolerance.Tolerance(0.0, 0.0, "replicas: every rank must hold bitwise the parameters of rank 0")


def distributed_maker(target: Target) -> Maker | None:
    """How `target` builds an optimizer over distributed parameters: its `make_distributed(params,
    case, mesh)` (the one protocol method, ours and third-party alike), None if it has none."""
    return getattr(target, "make_distributed", None)


def unsupported(target: Target, case: Case) -> str | None:
    """Why `target` cannot run `case` over its layout, or None (one process needs only `target.run`)."""
    if case.world_size > 1 and distributed_maker(target) is None:
        return f"target {target.name} has no distributed adapter (a make_distributed(params, case, mesh) method)"
    if case.tensor_parallel is not None and not getattr(target, "tensor_parallel", False):
        return (f"target {target.name} declares no tensor-parallel semantics (tp_mode, num_heads; set "
                f"`tensor_parallel = True` on an adapter that takes them from the case)")
    return target.unsupported(case)


def applicable(case: Case) -> list[str]:
    """Checks of a case over its layout, in the order they run: one process (world size 1) gets the
    single-process checks (harness.checks.applicable); a distributed layout gets reference,
    local_shard, layout and replicas. An algorithm whose distributed step is layout dependent by
    design (NorMuon's shard-local norm restore, Dion2's local selection scope) gets no
    layout-invariance check (harness.algorithms)."""
    if case.world_size == 1:
        return checks.applicable(case)
    invariant = algorithm(case).layout_invariant(case)
    return (["reference", "local_shard"] + (["layout"] if invariant else [])
            + (["replicas"] if case.layout == "replicated" else []))


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


def gather(case: Case, pieces: Pieces) -> Trajectory:
    """The whole parameters: the one process's, rank 0's copy when replicated, else every rank's piece
    put in its box."""
    if case.world_size == 1 or case.layout == "replicated":
        return pieces[0]
    boxes = regions(case.layout, case.world_size, case.shape)
    out = []
    for k in range(case.steps):
        step = []
        for i in range(case.megabatch):
            whole = pieces[0][k][i].new_empty(case.shape)
            for box, rank in zip(boxes, pieces):
                whole[box] = rank[k][i]
            step.append(whole)
        out.append(step)
    return out


def reference(case: Case, target: Target, inputs: Inputs, pieces: Pieces) -> Outcome:
    out = checks.reference(case, target, inputs, gather(case, pieces))
    if selection_blocks(case) is None or out.skipped:
        return out
    return dataclasses.replace(out, message=f"{out.message}; {scope_dependence(case, target, inputs, pieces)}")


def scope_dependence(case: Case, target: Target, inputs: Inputs, pieces: Pieces) -> str:
    """How far a local-scope run's update is from the global-scope reference update, re-seeded
    from the same parameters: max over members and steps of ||upd - upd_global|| / ||upd_global||."""
    whole = dataclasses.replace(case, scope="global")
    steps = checks.reference_steps(whole, target, inputs.params, inputs.grads, gather(case, pieces))
    worst = max(float(np.linalg.norm((x_new - x_prev) - (x_ref - x_prev)) / np.linalg.norm(x_ref - x_prev))
                for _, x_prev, x_new, x_ref in steps)
    return (f"layout dependence of the local selection scope (measured, not judged): the update is "
            f"{worst:.3g} (relative) from the global-scope update on {case.world_size} ranks")


def piece_tolerance(case: Case, tol: tolerance.Tolerance, share: float) -> tolerance.Tolerance:
    """The tolerance of one rank's piece of a step whose whole update has tolerance `tol`, the piece
    holding `share` = ||update_r|| / ||update|| of it: rtol / share, the whole's allowance
    (||err_r|| <= ||err|| <= rtol ||update||) relative to the piece.

    No tighter bound holds for every correct step. A deviation at the singular values alone
    (err = U diag(d) V^T) would give a piece at most sqrt(k) x the whole's relative error over the
    member's k singular directions, but rounding also moves the singular vectors: on NCCL ranks, the
    fp32 SVD of a 1 x 16 row vector (k = 1) put 2.3 x the whole's relative error into one rank's four
    columns (rel_err 7.2e-7 against the whole's 3.1e-7, 1.09 x a sqrt(k) allowance). An error confined
    to a piece still fails here once it exceeds what the whole may hold, and the layout check compares
    the distributed run with the single-process one far tighter. A piece whose reference update is
    zero is allowed its storage rounding only, as before."""
    factor = 1.0 / share if share > 0 else 1.0  # a piece the reference leaves unmoved: storage rounding only
    return tolerance.Tolerance(tol.rtol * factor, tol.storage_ulps,
                               f"{factor:.3g} x the step's rtol for one piece (1 / its share {share:.3g} of the "
                               f"update: the whole's allowance): {tol.source}")


def local_shard(case: Case, target: Target, inputs: Inputs, pieces: Pieces) -> Outcome:
    """Each rank's piece vs the same piece of the FP64 reference step (empty pieces hold nothing to
    judge), within `piece_tolerance` (a replicated rank's piece is the whole: the step's own tolerance)."""
    whole = gather(case, pieces)
    try:
        policy = checks.policy(case, target, inputs)
    except tolerance.NoEntry as gap:
        return checks.gap_or_tie("local_shard", gap, case, target, inputs, whole)
    why = policy.ill_posed()
    if why:
        return Outcome("local_shard", checks.NO_METRICS, None, why, skipped=True)
    boxes = regions(case.layout, case.world_size, case.shape)
    steps: list = []
    why = checks.selection_ill_posed(case, target, inputs, whole, steps)
    if why:
        return Outcome("local_shard", checks.NO_METRICS, None, why, skipped=True)
    pairs = []
    for r, (rank, index) in enumerate(zip(pieces, boxes)):
        for n, (where, x_prev, _, x_ref) in enumerate(steps):
            i, k = divmod(n, case.steps)
            mine = f64(rank[k][i])
            if mine.size:
                tol = policy.at(i, k)
                if case.layout != "replicated":
                    share = float(np.linalg.norm((x_ref - x_prev)[tuple(index)])
                                  / max(np.linalg.norm(x_ref - x_prev), np.finfo(float).tiny))
                    tol = piece_tolerance(case, tol, share)
                pairs.append((compare_step(x_prev[tuple(index)], mine, x_ref[tuple(index)], case.param_dtype,
                                           tol.rtol, tol.storage_ulps), f"rank {r} {where}", tol))
    metrics, where, tol = checks.worst_judged(pairs)
    return Outcome("local_shard", metrics, tol, checks.describe(metrics, where, tol))


def layout(case: Case, target: Target, inputs: Inputs, pieces: Pieces) -> Outcome:
    """Layout invariance: the gathered run against the target's single-process run of the same inputs."""
    single = target.run(inputs.params, inputs.grads, case)
    out = checks.relation("layout", case, target, inputs, gather(case, pieces), single)
    return dataclasses.replace(out, message=f"{case.layout_detail} on {case.world_size} ranks vs one process: "
                                            f"{out.message}")


def replicas(case: Case, target: Target, inputs: Inputs, pieces: Pieces) -> Outcome:
    """Every rank's replicated parameters bitwise equal rank 0's, member by member, step by step."""
    pairs = []
    for r in range(1, case.world_size):
        for k in range(case.steps):
            for i in range(case.megabatch):
                prev = f64(pieces[0][k - 1][i] if k else inputs.params[i])
                pairs.append((compare_step(prev, f64(pieces[r][k][i]), f64(pieces[0][k][i]), case.param_dtype,
                                           0.0, 0.0), f"rank {r} vs rank 0, member {i} step {k + 1}"))
    metrics, where = checks.worst_of(pairs)
    verdict = "bitwise identical" if metrics.ratio == 0 else f"DIFFER (worst at {where}, max_abs {metrics.max_abs:.3g})"
    return Outcome("replicas", metrics, REPLICAS, f"{case.world_size} replicas {verdict}")


CHECKS: dict[str, Callable[[Case, Target, Inputs, Pieces], Outcome]] = {
    "reference": reference, "local_shard": local_shard, "layout": layout, "replicas": replicas,
}
"""The checks of a distributed layout, judged from the ranks' pieces."""


def check(case: Case, name: str) -> Callable[[Case, Target, Inputs, Pieces], Outcome]:
    """The check `name` of `applicable(case)`, judged from pieces: a distributed layout's own, or for
    one process the single-process check (harness.checks.CHECKS) on its one piece."""
    if case.world_size > 1:
        return CHECKS[name]
    single = checks.CHECKS[name]
    return lambda case, target, inputs, pieces: single(case, target, inputs, gather(case, pieces))

__all__ = ["CHECKS", "Pieces", "applicable", "check", "distributed_maker", "gather", "rank_trajectory",
           "unsupported"]
