"""A step in two passes: plan, then execute.

`make_plan` runs every check of a step: each group's options (its algorithm's validator), its
parameters' DTensor layouts, every gradient (dense, the parameter's dtype, device, shape and
placements), every existing state entry (optimizers/state.py) and every megabatch's distributed
layout; it returns what will run. `execute` then creates missing state and runs the algorithm
stages; it writes, and it cannot fail on input the plan accepted. So a step either raises having
changed nothing (no parameter, gradient, state entry or group touched) or steps every parameter.

A parameter with no elements (a 0-size dim) is a no-op, as in torch's own optimizers: it gets no
state and leaves the others stepping exactly as without it.

`cache_key` is what a plan depends on; a plan is reused while the key is unchanged (see
optimizers/muon.py), so that a step re-validates only when the parameter set, a gradient's kind,
a group option or a state entry changed; lr and weight_decay, which schedulers change every
step and which shape nothing, are checked on every step instead (groups.check_scalars).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from optimizers import distributed, elementwise, launches, state as param_state, symmetric, tensor_parallel
from optimizers.algorithms import Algorithm
from optimizers.algorithms.base import decoupled_apply, decoupled_apply_all
from optimizers.algorithms.base import FOREACH_DTYPES, no_postprocess, select_all
from optimizers.algorithms.muon import (MOMENTUM, default_compute_dtype, momentum_direction, momentum_directions,
                                        orthogonalize_group)
from optimizers.matrix_view import as_matrices, matrix_count, matrix_dims
from optimizers.graphs import PlanGraphs, capturable as graph_eligible, stacked_block
from optimizers import gram_newton_schulz as gram
from optimizers.gram_newton_schulz import (DeferredChecks, FlagCopy, deferred_checks, iteration_dtype,
                                           takes_gram_iteration)
from optimizers.groups import SCALARS, check_group
from optimizers.validation import check_grad, check_layouts


@dataclass(frozen=True)
class Megabatch:
    """Same-shape parameters of one group stepped in one batched call; `layout`: how they lie on the
    ranks (None in one process; a MeshLayout on a mesh of 2+ dims or under tp_mode="per_shard")."""

    shape: tuple[int, ...]
    params: tuple[torch.Tensor, ...]
    layout: distributed.Layout | tensor_parallel.MeshLayout | None


@dataclass(frozen=True)
class GroupPlan:
    """One group's step: `params` are those with a gradient and at least one element, in the group's order
    for an elementwise algorithm; for a matrix algorithm `megabatches` partition them and `params` lists them
    megabatch by megabatch (so the fused momentum launch's sums of squares of a megabatch are consecutive
    rows: `execute`)."""

    group: dict[str, Any]
    algorithm: Algorithm
    params: tuple[torch.Tensor, ...]
    megabatches: tuple[Megabatch, ...]


def make_plan(param_groups: list[dict[str, Any]], state: dict[torch.Tensor, Any],
              process_group: dist.ProcessGroup | None, tp_dim: str = "tp") -> list[GroupPlan]:
    """Check everything a step reads (module docstring); ValueError/TypeError naming the group,
    the parameter and the option or key. Reads only: `state` entries are not created. `tp_dim`:
    the mesh dim name of tensor parallelism (optimizers/tensor_parallel.py)."""
    plans = []
    for index, group in enumerate(param_groups):
        where = f"param group {index}"
        algorithm = check_group(index, group)
        if not algorithm.elementwise:
            check_layouts(where, group["params"], process_group, algorithm.check_layout)
            for i, p in enumerate(group["params"]):
                tensor_parallel.check_heads(where, i, p, group, tp_dim)
        stepped = []
        for i, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            check_grad(where, i, p)
            if p.numel() == 0:
                continue
            if p in state:
                param_state.check(f"{where} parameter {i}", p, state[p], algorithm, group)
            stepped.append(p)
        if algorithm.elementwise:
            plans.append(GroupPlan(group, algorithm, tuple(stepped), ()))
            continue
        megabatches = _megabatches(stepped, process_group, group["tp_mode"], tp_dim)
        plans.append(GroupPlan(group, algorithm, tuple(p for b in megabatches for p in b.params), megabatches))
    return plans


def _megabatches(params: list[torch.Tensor], process_group: dist.ProcessGroup | None, tp_mode: str,
                 tp_dim: str) -> tuple[Megabatch, ...]:
    """Group `params` by (shape, dtype, device, placements), in first-appearance order; under a
    process group, member j of the step's megabatches in order is owned by rank j mod W (of the
    TP group, on a mesh of 2+ dims)."""
    buckets: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        buckets.setdefault((tuple(p.shape), p.dtype, p.device, distributed.placements(p)), []).append(p)
    out, first_owner = [], 0
    for (shape, *_), members in buckets.items():
        layout = None
        if process_group is not None and tensor_parallel.uses_mesh_layout(members[0], tp_mode, tp_dim):
            layout = tensor_parallel.mesh_layout(members[0], tp_mode, tp_dim, first_owner)
            first_owner += len(members)
        elif process_group is not None:
            layout = distributed.layout_of(members[0], process_group, first_owner)
            first_owner += len(members)
        out.append(Megabatch(shape, tuple(members), layout))
    return tuple(out)


def execute(plans: list[GroupPlan], state: dict[torch.Tensor, Any], graphs: PlanGraphs | None = None) -> None:
    """Run every group's stages (optimizers/algorithms/base.py) as planned; with `graphs`, the
    megabatch updates it may capture come from the plan's CUDA graph (optimizers/graphs.py), replayed once
    after every megabatch is submitted, and are applied after it. The stock
    `momentum_direction` and `decoupled_apply` stages run batched (`momentum_directions`,
    `decoupled_apply_all`: torch._foreach_* passes, the per-parameter bits); replaced stages run as given.

    An eager single-process megabatch whose result is checked on the host (Gram Newton–Schulz's divergence
    flags) is applied only after the next megabatch's kernels are queued (`Pending`): the GPU runs those
    while the host waits for the flags. Such megabatches run first (`run_order`), so each one's check is
    read behind another's work."""
    waiting: list[tuple[tuple[int, int], Callable[[torch.Tensor], None]]] = []
    pending: Pending | None = None
    for index, plan in enumerate(plans):
        algorithm, group = plan.algorithm, plan.group
        if algorithm.elementwise:
            for p in plan.params:
                entry = param_state.create(p, state[p], algorithm, group)
                update = algorithm.direction(p.grad, entry, group)
                algorithm.apply(distributed.local(p), update, entry, group, algorithm.lr_scale(tuple(p.shape), group))
            continue
        for batch in plan.megabatches:
            momentum_block(algorithm, batch, state)
        entries = [param_state.create(p, state[p], algorithm, group) for p in plan.params]
        parts = None  # the directions' sums of squares: a row per plan.params entry, megabatch n's from starts[n]
        if algorithm.direction is momentum_direction:  # the same bits, in a few foreach passes
            found, parts = momentum_directions([p.grad for p in plan.params], entries, group)
            directions = dict(zip(plan.params, found))
        else:
            directions = {p: algorithm.direction(p.grad, entry, group) for p, entry in zip(plan.params, entries)}
        starts = list(itertools.accumulate((len(b.params) for b in plan.megabatches), initial=0))
        for number in run_order(plan):
            batch = plan.megabatches[number]
            key, members = (index, number), [directions[p] for p in batch.params]
            direct = None
            if batch.layout is None:
                fused = elementwise.applies([distributed.local(p) for p in batch.params])
                direct = direct_dtype(algorithm, group, members[0], fused)
            if direct is not None:  # the compute-dtype result, applied as it is (direct_dtype)
                def update(stack: torch.Tensor, dtype: torch.dtype = direct,
                           norms: torch.Tensor | None = None) -> torch.Tensor:
                    return orthogonalize_group(as_matrices(stack, group["flatten"]), group, dtype, norms)
                finish = functools.partial(_apply_direct, algorithm, group, batch)
            else:
                update = algorithm.matrix_update(group, batch.shape)
                finish = functools.partial(_apply, algorithm, group, batch, state)
            if batch.layout is not None:
                finish(algorithm.exchange(torch.stack(members), batch.layout, update))
                continue
            if graphs is not None:
                result = graphs.submit(key, update, members, lambda stack: graph_eligible(algorithm, group, stack))
                if result is None:  # from the graph's replay
                    waiting.append((key, finish))
                else:
                    finish(result)
                continue
            block = stacked_block(members) if reads_only(algorithm) else None
            stack = torch.stack(members) if block is None else block
            if direct is not None and block is not None and parts is not None and takes_norms(group, batch.shape):
                update = functools.partial(update, norms=elementwise.norms(parts[starts[number]:starts[number + 1]]))
            with deferred_checks() as checks:
                result = update(stack)
            previous = pending
            pending = Pending(result, checks, functools.partial(update, stack), finish) if checks.flags else None
            if previous is not None:  # its flag is read while the GPU runs this megabatch
                previous.settle()
            if pending is None:
                finish(result)
    if pending is not None:
        pending.settle()
    if waiting:
        results = graphs.flush()
        for key, finish in waiting:
            finish(results[key])


@dataclass
class Pending:
    """An eager megabatch's `result`, computed with its Gram divergence checks deferred (`checks`), not yet
    applied. Made right after the megabatch's kernels are queued, it starts copying their flag to the host
    (gram_newton_schulz.FlagCopy); `settle` reads it: where none diverged, the result is applied (and its
    Gram matrices counted in gram_newton_schulz.STATS); else the update is run again eagerly (`redo`),
    where the standard-iteration fallback runs and counts, and that is applied. In a rehearsal
    (optimizers/launches.py, meta tensors) nothing is read or counted: the result is applied as it is."""

    result: torch.Tensor
    checks: DeferredChecks
    redo: Callable[[], torch.Tensor]
    finish: Callable[[torch.Tensor], None]
    flag: FlagCopy | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not launches.noting():
            self.flag = FlagCopy(self.checks)

    def settle(self) -> None:
        result = self.result
        if self.flag is not None:
            if self.flag.diverged():
                result = self.redo()
            else:
                gram.STATS.gram += self.checks.matrices
        self.finish(result)


def takes_norms(group: dict[str, Any], shape: tuple[int, ...]) -> bool:
    """A megabatch of Muon's direct path (`direct_dtype`) whose directions are the live momentum block may
    divide by the norms the fused momentum launch formed (optimizers/elementwise.py `norms`, in place of a
    pass of their own): under Gram Newton–Schulz (whose normaliser is formed in fp32), each parameter one
    matrix of its matrix view."""
    return (group["orthogonalizer"] == "gram_newton_schulz"
            and matrix_count(shape, group["flatten"], group["num_heads"]) == 1)


def run_order(plan: GroupPlan) -> list[int]:
    """The indices of `plan.megabatches` in the order `execute` runs them: first the single-process ones
    whose result is checked on the host (Gram Newton–Schulz on wide or tall matrices), then the rest, each
    part in plan order."""
    group = plan.group
    if group.get("orthogonalizer") != "gram_newton_schulz":
        return list(range(len(plan.megabatches)))

    def checked(batch: Megabatch) -> bool:
        return batch.layout is None and takes_gram_iteration(*matrix_dims(batch.shape, group["flatten"],
                                                                          group.get("num_heads")))

    return sorted(range(len(plan.megabatches)), key=lambda n: not checked(plan.megabatches[n]))


def compile_ahead(plans: list[GroupPlan], state: dict[torch.Tensor, Any]) -> int:
    """Compile the Triton kernels a step of `plans` will launch on CUDA, side by side, before it runs
    (optimizers/launches.py). Returns how many compiled: 0 where no kernel is switched on, or the
    single-process megabatches do not lie on one CUDA device."""
    if not (symmetric.TRITON or elementwise.TRITON):
        return 0
    devices = {b.params[0].device for p in plans for b in p.megabatches if b.layout is None}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        return 0
    return compile_for(plans, state, devices.pop())


def compile_for(plans: list[GroupPlan], state: dict[torch.Tensor, Any], device: torch.device) -> int:
    """`compile_ahead` on `device`. Where the default symmetric kernel variant compiles slowly
    (symmetric_triton.STAND_INS) and this plan launches specializations of it not compiled yet in this
    process, those compile in the background while its stand-in, of the same bits, runs (WARMING): the
    step's launches with the stand-in compile now. While one background compile runs, later plans compile
    ahead with the stand-in (what they launch of the slow variant afterwards compiles at its launch)."""
    kernel = symmetric.triton_kernel() if symmetric.TRITON else None
    variant = None if kernel is None else kernel.VARIANT
    if variant not in getattr(kernel, "STAND_INS", {}) or variant in kernel.WARMING:
        return launches.compile_all(rehearse(plans, state), device)
    later = rehearse(plans, state)
    if all(launches.compiled(item) for item in later):  # every launch compiled already: no stand-in needed
        return launches.compile_all(later, device)
    kernel.WARMING.add(variant)
    now = rehearse(plans, state)
    first = {id(item.kernel) for item in now}
    background = [item for item in later if id(item.kernel) not in first and not launches.compiled(item)]
    if not background:  # nothing of the variant left to compile: it runs at once
        kernel.WARMING.discard(variant)
        return launches.compile_all(later, device)
    compiled = launches.compile_all(now, device)
    launches.compile_in_background(background, device, lambda: kernel.WARMING.discard(variant))
    return compiled


def rehearse(plans: list[GroupPlan], state: dict[torch.Tensor, Any]) -> list[launches.Launch]:
    """The kernel launches a step of `plans` makes for its single-process megabatches, in order: the step
    executed on meta tensors standing in for their parameters, gradients and state entries, its launches
    noted instead of run (launches.recording) and its Gram divergence checks deferred. Nothing real is
    read or written. Groups whose algorithm selects rows by their values (a `select` stage other than
    `select_all`: Dion2) are left out: their shapes are not known before the step."""
    shadows = []
    stand_in: dict[torch.Tensor, torch.Tensor] = {}
    for p in plans:
        batches = [b for b in p.megabatches if b.layout is None]
        if p.algorithm.elementwise or p.algorithm.select is not select_all or not batches:
            continue
        for b in batches:
            for q in b.params:
                stand_in[q] = _meta(q)
                stand_in[q].grad = _meta(q.grad)
        megabatches = tuple(Megabatch(b.shape, tuple(stand_in[q] for q in b.params), None) for b in batches)
        params = tuple(q for b in megabatches for q in b.params)
        # the options a parameter's device decides, decided by the real device (the stand-ins are on meta)
        group = {**p.group, "params": list(params)}
        if "compute_dtype" in group:
            group["compute_dtype"] = group["compute_dtype"] or default_compute_dtype(batches[0].params[0].device)
        shadows.append(GroupPlan(group, p.algorithm, params, megabatches))
    shadow_state = {stand_in[q]: {k: _meta(v) if isinstance(v, torch.Tensor) else v for k, v in state[q].items()}
                    for q in stand_in}
    with launches.recording() as noted:
        execute(shadows, shadow_state)
    return noted


def _meta(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with `t`'s shape, strides, dtype and storage offset (its address modulo 16)."""
    local = distributed.local(t)
    span = 1 + sum((n - 1) * s for n, s in zip(local.shape, local.stride())) if local.numel() else 0
    storage = torch.empty(local.storage_offset() + span, dtype=local.dtype, device="meta")
    return storage.as_strided(local.shape, local.stride(), local.storage_offset())


def _apply_direct(algorithm: Algorithm, group: dict[str, Any], batch: Megabatch, matrices: torch.Tensor) -> None:
    """Apply a megabatch's orthogonalized `matrices` [B, m, n], in the compute dtype (direct_dtype)."""
    scale = algorithm.lr_scale(batch.shape, group)
    if not fused_apply(batch.params, matrices, group, scale):
        for p, update in zip(batch.params, matrices.reshape((len(batch.params),) + batch.shape).unbind(0)):
            decoupled_apply(distributed.local(p), update, {}, group, scale)


def _apply(algorithm: Algorithm, group: dict[str, Any], batch: Megabatch, state: dict[torch.Tensor, Any],
           updates: torch.Tensor) -> None:
    """The algorithm's postprocess and apply stages on a megabatch's `updates` [N, *shape]."""
    entries = [state[p] for p in batch.params]
    updates = algorithm.postprocess(updates, entries, group)
    scale = algorithm.lr_scale(batch.shape, group)
    if algorithm.apply is decoupled_apply:  # the same bits, in one or two foreach passes (or one fused)
        if not fused_apply(batch.params, updates.flatten(2), group, scale):
            decoupled_apply_all([distributed.local(p) for p in batch.params], list(updates.unbind(0)), group, scale)
        return
    for p, entry, update in zip(batch.params, entries, updates.unbind(0)):
        algorithm.apply(distributed.local(p), update, entry, group, scale)


def fused_apply(params: tuple[torch.Tensor, ...], matrices: torch.Tensor, group: dict[str, Any], scale: float) -> bool:
    """`decoupled_apply` of every parameter of a megabatch from its matrices [B, m, n] (the orthogonalized
    matrix view, any strides) by optimizers.elementwise's fused kernel, where it runs (else False: nothing
    done)."""
    decay = 1.0 - group["lr"] * group["weight_decay"] if group["weight_decay"] else None
    return elementwise.apply_([distributed.local(p) for p in params], matrices, decay, -group["lr"] * scale)


def momentum_block(algorithm: Algorithm, batch: Megabatch, state: dict[torch.Tensor, Any]) -> None:
    """Create the momentum buffers of a single-process megabatch whose parameters have no state yet as
    the rows of one zero block [N, *shape] (each buffer a view `block[i]`, the zeros `create` would
    make), so that without Nesterov the stack of their directions is the block itself (`stacked_block`):
    no copy. Only for `momentum_direction` and plain contiguous parameters; others are left to `create`."""
    params = batch.params
    if (batch.layout is not None or len(params) < 2 or algorithm.direction is not momentum_direction
            or MOMENTUM not in algorithm.state or any(state[p] for p in params)
            or any(isinstance(p, DTensor) or not p.is_contiguous() for p in params)):
        return
    block = torch.zeros((len(params),) + tuple(params[0].shape), dtype=params[0].dtype, device=params[0].device)
    for p, row in zip(params, block.unbind(0)):
        state[p][MOMENTUM.name] = row


DIRECT_APPLY_NUMEL = 1 << 22
"""Parameters of at least this many elements apply a half-precision result directly (`direct_dtype`)."""


def direct_dtype(algorithm: Algorithm, group: dict[str, Any], member: torch.Tensor, fused: bool = False
                 ) -> torch.dtype | None:
    """The compute dtype when Muon's own stages (read-only matrix stages, no postprocess, the decoupled
    apply) may apply the orthogonalized result in it, without casting it back first: bf16/fp16 results of
    fp32/fp64 parameters. The apply widens each value exactly, as the cast did: the same bits, one pass (a
    read and a write of the whole stack) fewer.

    `fused`: the megabatch is applied by optimizers.elementwise's kernel, which reads the result's matrices
    where they lie, of any size, tall ones (a transposed view) too; and a Gram Newton–Schulz request
    iterating in another dtype (gram_newton_schulz.iteration_dtype: bf16 in fp16) is applied in that dtype
    (square matrices, which take the standard iteration, in the compute dtype)
    (the same bits, but for a divergence's fallback: its bf16 values below 2^-17 in magnitude round to
    fp16's subnormal spacing). Else, one add per parameter, at least DIRECT_APPLY_NUMEL elements (at that
    size it costs no more than a foreach pass), not tall (the cast makes a transposed result contiguous),
    and not Gram iterating in another dtype (its result's dtype depends on the shape and on a fallback).
    None where it does not apply."""
    if (not reads_only(algorithm) or algorithm.postprocess is not no_postprocess
            or algorithm.apply is not decoupled_apply or group["num_heads"] is not None
            or group["orthogonalizer"] == "svd"  # computed in fp32/fp64 whatever the compute dtype
            or member.dtype not in FOREACH_DTYPES or (not fused and member.numel() < DIRECT_APPLY_NUMEL)):
        return None
    compute = group["compute_dtype"] or default_compute_dtype(member.device)
    if compute not in (torch.bfloat16, torch.float16):
        return None
    rows, cols = as_matrices(member.unsqueeze(0), group["flatten"]).shape[-2:]
    if (group["orthogonalizer"] == "gram_newton_schulz" and iteration_dtype(compute) != compute
            and takes_gram_iteration(rows, cols)):
        return iteration_dtype(compute) if fused else None  # (square matrices take the standard iteration)
    return compute if fused or rows <= cols else None


def reads_only(algorithm: Algorithm) -> bool:
    """True when the algorithm's matrix stages only read their input stack (Muon's own: select_all and
    orthogonalize_group), so it may be the live momentum block."""
    return algorithm.select is select_all and algorithm.orthogonalize is orthogonalize_group


def cache_key(param_groups: list[dict[str, Any]], state: dict[torch.Tensor, Any]) -> tuple[tuple, list]:
    """(key, objects): what a plan depends on, compared with ==: every group option but lr and
    weight_decay (groups.SCALARS, checked on every step instead), with its type (lists as tuples), every parameter's identity, shape, dtype, device and placements, its gradient's kind
    (shape, dtype, device, layout, placements; not its values), and its state entries (a tensor by
    identity, a step count by validity). `objects` are the state tensors named by identity: a cache
    holding them keeps their ids from being reused by other tensors."""
    parts: list[Any] = []
    objects: list[Any] = []
    for group in param_groups:
        parts.append(tuple((k, type(v), tuple(v) if isinstance(v, list) else v)
                           for k, v in group.items() if k != "params" and k not in SCALARS))
        for p in group["params"]:
            g, entry = p.grad, state.get(p)
            grad = None if g is None else (g.shape, g.dtype, g.device, g.layout, distributed.placements(g))
            held = None
            if entry:
                objects.extend(entry.values())
                held = tuple((k, id(v) if isinstance(v, torch.Tensor) else type(v) is int and v >= 0)
                             for k, v in entry.items())
            parts.append((id(p), p.shape, p.dtype, p.device, distributed.placements(p), grad, held))
    return tuple(parts), objects


def fingerprint(param_groups: list[dict[str, Any]]) -> list[tuple]:
    """What every rank must agree on: per parameter (group, index, shape, dtype, placements, has a
    gradient), in order."""
    return [(index, i, tuple(p.shape), str(p.dtype), repr(distributed.placements(p)), p.grad is not None)
            for index, group in enumerate(param_groups) for i, p in enumerate(group["params"])]


def digest(entries: list[tuple]) -> int:
    """A signed 63-bit hash of `entries`, the same in every process (unlike hash() of strings)."""
    return int.from_bytes(hashlib.blake2b(repr(entries).encode(), digest_size=8).digest(), "big") >> 1
