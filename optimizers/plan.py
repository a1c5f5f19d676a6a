"""A step in two passes: plan, then execute.

`make_plan` runs every check of a step: each group's options (its algorithm's validator and the
options every group has, optimizers/groups.py), its parameters' DTensor layouts, every gradient
(dense, the parameter's dtype, device, shape and placements), every existing state entry
(optimizers/state.py) and every megabatch's distributed layout; it returns what will run,
including which fast paths each group's stages allow (`Paths`: what the stages declare,
optimizers/algorithms/stages.py, and the group's options). `execute` then creates missing state
and runs the algorithm stages; it writes, and it cannot fail on input the plan accepted. So a
step either raises having changed nothing (no parameter, gradient, state entry or group touched)
or steps every parameter.

A parameter with no elements (a 0-size dim) is a no-op, as in torch's own optimizers: it gets no
state and leaves the others stepping exactly as without it.

`cache_key` is what a plan depends on; a plan is reused while the key is unchanged (see
optimizers/muon.py), so that a step re-validates only when the parameter set, a gradient's kind,
a group option (`fused` and `cuda_graphs` among them: a changed one makes a fresh plan, compiled
ahead as the first was) or a state entry changed; lr and weight_decay, which schedulers change
every step and which shape nothing, are checked on every step instead (groups.check_scalars).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from optimizers import counters, distributed, elementwise, kernels, launches, state as param_state, symmetric
from optimizers import tensor_parallel
from optimizers.algorithms import Algorithm, resolve
from optimizers.algorithms.base import FOREACH_DTYPES
from optimizers.algorithms.stages import Apply, Direction, Orthogonalize, declared
from optimizers.graphs import PlanGraphs, capturable, fits, stacked_block
from optimizers.gram_newton_schulz import DeferredChecks, FlagCopy, deferred_checks
from optimizers.groups import SCALARS, check_group
from optimizers.matrix_view import View
from optimizers.validation import check_grad, check_layouts


@dataclass(frozen=True)
class Megabatch:
    """Same-shape parameters of one group stepped in one batched call; `layout`: how they lie on the
    ranks (None in one process; a MeshLayout on a mesh of 2+ dims or under tp_mode="per_shard")."""

    shape: tuple[int, ...]
    params: tuple[torch.Tensor, ...]
    layout: distributed.Layout | tensor_parallel.MeshLayout | None


@dataclass(frozen=True)
class Paths:
    """What a matrix group's step runs in place of its stages' general path, decided from what the stages
    declare (optimizers/algorithms/stages.py) and the group's options; each gives the general path's bits.

    view: the group's matrix view (its algorithm's `view` accessor);
    direction: the direction record whose batched form runs (None: one parameter at a time);
    block: the state key whose tensors a megabatch creates as the rows of one block (Direction.buffer);
    orthogonalize: the declared orthogonalize record (its `checked` orders the megabatches), or None;
    reads_only: the matrix stages only read their input (a whole select and Orthogonalize.reads_only), which
      may then be the live block;
    apply: the declared apply record (its foreach and fused forms, its widening), or None;
    direct: the orthogonalized result may be applied in its compute dtype (`direct_dtype`);
    graphs: the megabatch updates may be captured in the plan's CUDA graph (the group's cuda_graphs not False,
      a reading-only orthogonalize declared `captured` for the group);
    rehearsed: the megabatches' shapes are known before the step (a whole select), so a rehearsal on meta
      tensors (`rehearse`) notes the kernels they launch.
    """

    view: View
    direction: Direction | None
    block: str | None
    orthogonalize: Orthogonalize | None
    reads_only: bool
    apply: Apply | None
    direct: bool
    graphs: bool
    rehearsed: bool


def paths(algorithm: Algorithm, group: dict[str, Any]) -> Paths:
    """The Paths of a validated matrix group of `algorithm`."""
    direction = declared(algorithm.direction, Direction)
    orthogonalize = declared(algorithm.orthogonalize, Orthogonalize)
    apply = declared(algorithm.apply, Apply)
    view = algorithm.view(group)
    whole = algorithm.select is None
    reads_only = whole and orthogonalize is not None and orthogonalize.reads_only
    direct = (reads_only and orthogonalize.direct is not None and algorithm.postprocess is None
              and apply is not None and apply.widens and view.num_heads is None)
    graphs = (group["cuda_graphs"] is not False and reads_only and orthogonalize.captured is not None
              and orthogonalize.captured(group))
    return Paths(view, direction if direction is not None and direction.batched is not None else None,
                 None if direction is None else direction.buffer, orthogonalize, reads_only, apply, direct,
                 graphs, whole)


@dataclass(frozen=True)
class GroupPlan:
    """One group's step: `params` are those with a gradient and at least one element, in the group's order
    for an elementwise algorithm; for a matrix algorithm `megabatches` partition them and `params` lists them
    megabatch by megabatch (so the fused momentum launch's sums of squares of a megabatch are consecutive
    rows: `execute`), and `paths` says which fast paths its stages allow (None for an elementwise one)."""

    group: dict[str, Any]
    algorithm: Algorithm
    params: tuple[torch.Tensor, ...]
    megabatches: tuple[Megabatch, ...]
    paths: Paths | None = None


def make_plan(param_groups: list[dict[str, Any]], state: dict[torch.Tensor, Any],
              process_group: dist.ProcessGroup | None, tp_dim: str = "tp") -> list[GroupPlan]:
    """Check everything a step reads (module docstring); ValueError/TypeError naming the group,
    the parameter and the option or key. Reads only: `state` entries are not created. `tp_dim`:
    the mesh dim name of tensor parallelism (optimizers/tensor_parallel.py)."""
    plans, fills = [], []
    for index, live in enumerate(param_groups):
        where = f"param group {index}"
        record = resolve(where, live.get("algorithm"))
        missing = {k: v for k, v in record.defaults.items() if k not in live}  # an algorithm switched in
        group = {**live, **missing}
        fills.append((live, missing))
        algorithm = check_group(index, group)
        view = None if algorithm.elementwise else algorithm.view(group)
        if view is not None:
            check_layouts(where, group["params"], process_group, algorithm.check_layout)
            for i, p in enumerate(group["params"]):
                tensor_parallel.check_heads(where, i, p, view, tp_dim)
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
        if view is None:
            plans.append(GroupPlan(live, algorithm, tuple(stepped), ()))
            continue
        megabatches = _megabatches(stepped, process_group, view.tp_mode, tp_dim)
        plans.append(GroupPlan(live, algorithm, tuple(p for b in megabatches for p in b.params), megabatches,
                               paths(algorithm, group)))
    for live, missing in fills:  # every group is valid: the options a switched-in algorithm lacked take its defaults
        live.update(missing)
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
    """Run every group's stages (optimizers/algorithms/base.py) as planned, by the forms their `Paths` allow:
    a declared direction's batched form over the group, a declared apply's fused or foreach form per
    megabatch, the direct apply of a compute-dtype result (`direct_dtype`), the live momentum block as a
    megabatch's stack (`momentum_block`); undeclared stages run as given. With `graphs`, the megabatch
    updates of groups whose paths allow it come from the plan's CUDA graph (optimizers/graphs.py), replayed
    once after every megabatch is submitted, and are applied after it.

    An eager single-process megabatch whose result is checked on the host (Gram Newton–Schulz's divergence
    flags) is applied only after the next megabatch's kernels are queued (`Pending`): the GPU runs those
    while the host waits for the flags. Such megabatches run first (`run_order`), so each one's check is
    read behind another's work."""
    waiting: list[tuple[tuple[int, int], Callable[[torch.Tensor], None]]] = []
    pending: Pending | None = None
    for index, plan in enumerate(plans):
        algorithm, group, route = plan.algorithm, plan.group, plan.paths
        if route is None:  # an elementwise algorithm
            for p in plan.params:
                entry = param_state.create(p, state[p], algorithm, group)
                update = algorithm.direction(p.grad, entry, group)
                algorithm.apply(distributed.local(p), update, entry, group, algorithm.lr_scale(tuple(p.shape), group))
            continue
        if route.block is not None:
            for batch in plan.megabatches:
                momentum_block(route.block, algorithm, group, batch, state)
        entries = [param_state.create(p, state[p], algorithm, group) for p in plan.params]
        parts = None  # the directions' sums of squares: a row per plan.params entry, megabatch n's from starts[n]
        if route.direction is not None:  # the same bits, in a few foreach passes (or one fused launch)
            found, parts = route.direction.batched([p.grad for p in plan.params], entries, group)
            directions = dict(zip(plan.params, found))
        else:
            directions = {p: algorithm.direction(p.grad, entry, group) for p, entry in zip(plan.params, entries)}
        starts = list(itertools.accumulate((len(b.params) for b in plan.megabatches), initial=0))
        every = group["cuda_graphs"] is True  # graphs.fits: capture stacks of any size
        for number in run_order(plan):
            batch = plan.megabatches[number]
            key, members = (index, number), [directions[p] for p in batch.params]
            direct = None
            if batch.layout is None and route.direct:
                xs = [distributed.local(p) for p in batch.params]
                direct = direct_dtype(route, group, members[0], route.apply.fuses is not None
                                      and route.apply.fuses(xs, group))
            if direct is not None:  # the compute-dtype result, applied as it is (direct_dtype)
                update = functools.partial(_direct_update, route, group, batch.shape, direct)
                finish = functools.partial(_apply_direct, algorithm, group, route, batch, state)
            else:
                update = algorithm.matrix_update(group, batch.shape)
                finish = functools.partial(_apply, algorithm, group, route, batch, state)
            if batch.layout is not None:
                finish(algorithm.exchange(torch.stack(members), batch.layout, update))
                continue
            if route.graphs and fits(len(members) * math.prod(batch.shape), every):
                update = kernels.in_graph(update)  # the graph's kernels, in its eager first step and rehearsal too
            block = stacked_block(members) if route.reads_only else None
            given = None  # the momentum launch's norms of the members, where they are its buffers (one block)
            if (block is not None and direct is not None and parts is not None
                    and takes_norms(route, group, batch.shape)):
                given = elementwise.norms(parts[starts[number]:starts[number + 1]])
            if graphs is not None and route.graphs:
                eligible = functools.partial(capturable, every=every)
                result = graphs.submit(key, update, members, eligible, given)
                if result is None:  # from the graph's replay
                    waiting.append((key, finish))
                else:
                    finish(result)
                continue
            stack = torch.stack(members) if block is None else block
            if given is not None:
                update = functools.partial(update, norms=given)
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
    Gram matrices counted in the current counting scope, optimizers/counters.py); else the update is run
    again eagerly (`redo`), where the standard-iteration fallback runs and counts, and that is applied. In a
    rehearsal (optimizers/launches.py, meta tensors) nothing is read: the result is applied as it is."""

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
            stats = counters.current()
            if self.flag.diverged():
                result = self.redo()
            elif stats is not None:
                stats.gram += self.checks.matrices
        self.finish(result)


def takes_norms(route: Paths, group: dict[str, Any], shape: tuple[int, ...]) -> bool:
    """A megabatch of the direct path (`direct_dtype`) whose directions are the live momentum block may divide
    by the norms the fused momentum launch formed (optimizers/elementwise.py `norms`, in place of a pass of their
    own): where its orthogonalize stage declares it takes them for the group (Orthogonalize.norms), each
    parameter one matrix of its matrix view."""
    norms = route.orthogonalize.norms
    return norms is not None and norms(group) and route.view.count(shape) == 1


def run_order(plan: GroupPlan) -> list[int]:
    """The indices of `plan.megabatches` in the order `execute` runs them: first the single-process ones
    whose result its orthogonalize stage checks on the host (Orthogonalize.checked: Gram Newton–Schulz on wide
    or tall matrices), then the rest, each part in plan order."""
    orthogonalize = plan.paths.orthogonalize
    if orthogonalize is None or orthogonalize.checked is None:
        return list(range(len(plan.megabatches)))

    def checked(batch: Megabatch) -> bool:
        return batch.layout is None and orthogonalize.checked(plan.group, *plan.paths.view.dims(batch.shape))

    return sorted(range(len(plan.megabatches)), key=lambda n: not checked(plan.megabatches[n]))


def compile_ahead(plans: list[GroupPlan], state: dict[torch.Tensor, Any]) -> int:
    """Compile the Triton kernels a step of `plans` will launch on CUDA, side by side, before it runs
    (optimizers/launches.py). Returns how many compiled: 0 where no group's `fused` option takes a kernel
    there (optimizers/kernels.py), or the single-process megabatches do not lie on one CUDA device."""
    batches = [(p.group, b.params[0]) for p in plans for b in p.megabatches if b.layout is None]
    devices = {first.device for _, first in batches}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        return 0
    if not any(kernels.of(group["fused"], first).on for group, first in batches):
        return 0
    return compile_for(plans, state, devices.pop())


def compile_for(plans: list[GroupPlan], state: dict[torch.Tensor, Any], device: torch.device) -> int:
    """`compile_ahead` on `device`. Where the default symmetric kernel variant compiles slowly
    (symmetric_triton.slow_default) and this plan launches specializations of it not compiled yet in this
    process, those compile in the background while its stand-in, of the same bits, runs (WARMING): the
    step's launches with the stand-in compile now. While one background compile runs, later plans compile
    ahead with the stand-in (what they launch of the slow variant afterwards compiles at its launch)."""
    kernel = symmetric.triton_kernel()
    variant = None if kernel is None else kernel.slow_default()
    if variant is None or variant in kernel.WARMING:
        return launches.compile_all(rehearse(plans, state, device), device)
    later = rehearse(plans, state, device)
    if all(launches.compiled(item) for item in later):  # every launch compiled already: no stand-in needed
        return launches.compile_all(later, device)
    kernel.WARMING.add(variant)
    now = rehearse(plans, state, device)
    first = {id(item.kernel) for item in now}
    background = [item for item in later if id(item.kernel) not in first and not launches.compiled(item)]
    if not background:  # nothing of the variant left to compile: it runs at once
        kernel.WARMING.discard(variant)
        return launches.compile_all(later, device)
    compiled = launches.compile_all(now, device)
    launches.compile_in_background(background, device, lambda: kernel.WARMING.discard(variant))
    return compiled


def rehearse(plans: list[GroupPlan], state: dict[torch.Tensor, Any],
             device: torch.device | None = None) -> list[launches.Launch]:
    """The kernel launches a step of `plans` makes for its single-process megabatches, in order: the step
    executed on meta tensors standing in for their parameters, gradients and state entries (on `device`,
    default the first such parameter's: launches.device_of), its launches noted instead of run
    (launches.recording), its Gram divergence checks deferred and nothing counted. Nothing real is read or
    written. Groups whose shapes are not known before the step (a `select` stage: Dion2 selects rows by their
    values) are left out."""
    shadows = []
    stand_in: dict[torch.Tensor, torch.Tensor] = {}
    for p in plans:
        batches = [b for b in p.megabatches if b.layout is None]
        if p.paths is None or not p.paths.rehearsed or not batches:
            continue
        device = device or batches[0].params[0].device
        for b in batches:
            for q in b.params:
                stand_in[q] = _meta(q)
                stand_in[q].grad = _meta(q.grad)
        megabatches = tuple(replace(b, params=tuple(stand_in[q] for q in b.params)) for b in batches)
        params = tuple(q for b in megabatches for q in b.params)
        shadows.append(replace(p, group={**p.group, "params": list(params)}, params=params, megabatches=megabatches))
    blocks: dict[int, torch.Tensor] = {}
    shadow_state = {stand_in[q]: {k: _meta_row(v, blocks) if isinstance(v, torch.Tensor) else v
                                  for k, v in state[q].items()} for q in stand_in}
    with launches.recording(device) as noted, counters.counting(None):
        execute(shadows, shadow_state)
    return noted


def _meta_row(t: torch.Tensor, blocks: dict[int, torch.Tensor]) -> torch.Tensor:
    """`_meta(t)`, but a row of a contiguous block (a buffer `momentum_block` made) is the same row of one meta
    block standing in for it (`blocks`, by the real block's id), so that the stand-in rows of a megabatch are a
    block too (`stacked_block`) and the rehearsal takes the block's paths (the momentum launch's norms), as the
    step does."""
    base = t._base
    if base is None or isinstance(t, DTensor) or not base.is_contiguous():
        return _meta(t)
    block = blocks.setdefault(id(base), torch.empty_like(base, device="meta"))
    return block.as_strided(t.shape, t.stride(), t.storage_offset() - base.storage_offset())


def _meta(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with `t`'s shape, strides, dtype and storage offset (its address modulo 16)."""
    local = distributed.local(t)
    span = 1 + sum((n - 1) * s for n, s in zip(local.shape, local.stride())) if local.numel() else 0
    storage = torch.empty(local.storage_offset() + span, dtype=local.dtype, device="meta")
    return storage.as_strided(local.shape, local.stride(), local.storage_offset())


def _direct_update(route: Paths, group: dict[str, Any], shape: tuple[int, ...], dtype: torch.dtype,
                   stack: torch.Tensor, norms: torch.Tensor | None = None) -> torch.Tensor:
    """The orthogonalized matrices [B, m, n] of a megabatch's stack, in `dtype` (direct_dtype), dividing by
    `norms` where given (takes_norms)."""
    given = {} if norms is None else {"norms": norms}
    return route.orthogonalize.run(route.view.matrices(stack, shape), group, dtype, **given)


def _apply_direct(algorithm: Algorithm, group: dict[str, Any], route: Paths, batch: Megabatch,
                  state: dict[torch.Tensor, Any], matrices: torch.Tensor) -> None:
    """Apply a megabatch's orthogonalized `matrices` [B, m, n], in the compute dtype (direct_dtype): by the
    apply's fused form where it runs, else one parameter at a time."""
    scale = algorithm.lr_scale(batch.shape, group)
    xs = [distributed.local(p) for p in batch.params]
    apply = route.apply
    if apply.fused is not None and apply.fused(xs, matrices, group, scale):
        return
    for x, p, update in zip(xs, batch.params, matrices.reshape((len(xs),) + batch.shape).unbind(0)):
        apply.run(x, update, state[p], group, scale)


def _apply(algorithm: Algorithm, group: dict[str, Any], route: Paths, batch: Megabatch,
           state: dict[torch.Tensor, Any], updates: torch.Tensor) -> None:
    """The algorithm's postprocess and apply stages on a megabatch's `updates` [N, *shape]: a declared apply
    by its fused form where it runs, else its foreach form; an undeclared one per parameter."""
    entries = [state[p] for p in batch.params]
    if algorithm.postprocess is not None:
        updates = algorithm.postprocess(updates, entries, group)
    scale = algorithm.lr_scale(batch.shape, group)
    xs = [distributed.local(p) for p in batch.params]
    apply = route.apply
    if apply is not None and apply.fused is not None and apply.fused(xs, updates.flatten(2), group, scale):
        return
    if apply is not None and apply.foreach is not None:
        apply.foreach(xs, list(updates.unbind(0)), group, scale)
        return
    for x, entry, update in zip(xs, entries, updates.unbind(0)):
        algorithm.apply(x, update, entry, group, scale)


def momentum_block(key: str, algorithm: Algorithm, group: dict[str, Any], batch: Megabatch,
                   state: dict[torch.Tensor, Any]) -> None:
    """Create the state entries `key` (a direction's buffer, Direction.buffer) of a single-process megabatch
    whose parameters have no state yet as the rows of one zero block [N, *shape] (each a view `block[i]`, the
    zeros `create` would make), so that where the directions are those buffers the stack of the directions is
    the block itself (`stacked_block`): no copy. Only for a key of the algorithm's state shaped like the
    parameter, and plain contiguous parameters; others are left to `create`."""
    params = batch.params
    if (batch.layout is not None or len(params) < 2 or any(state[p] for p in params)
            or any(isinstance(p, DTensor) or not p.is_contiguous() for p in params)):
        return
    shape = tuple(params[0].shape)
    if not any(k.name == key and k.shape is not None and k.shape(shape, group) == shape for k in algorithm.state):
        return
    block = torch.zeros((len(params),) + shape, dtype=params[0].dtype, device=params[0].device)
    for p, row in zip(params, block.unbind(0)):
        state[p][key] = row


DIRECT_APPLY_NUMEL = 1 << 22
"""Parameters of at least this many elements apply a half-precision result directly (`direct_dtype`)."""


def direct_dtype(route: Paths, group: dict[str, Any], member: torch.Tensor, fused: bool = False
                 ) -> torch.dtype | None:
    """The dtype in which a megabatch whose paths allow the direct apply (reading-only matrix stages, no
    postprocess, an apply that widens exactly, no head blocks: `Paths.direct`) applies its orthogonalized
    result without casting it back first: the bf16/fp16 dtype its orthogonalize stage may return it in
    (Orthogonalize.direct), for fp32/fp64 parameters. The apply widens each value exactly, as the cast did:
    the same bits, one pass (a read and a write of the whole stack) fewer.

    `fused`: the megabatch is applied by the apply's fused form, which reads the result's matrices where they
    lie, of any size, tall ones (a transposed view) too. Else, one add per parameter, at least
    DIRECT_APPLY_NUMEL elements (at that size it costs no more than a foreach pass). None where it does not
    apply."""
    if (not route.direct or member.dtype not in FOREACH_DTYPES
            or (not fused and member.numel() < DIRECT_APPLY_NUMEL)):
        return None
    rows, cols = route.view.dims(tuple(member.shape))
    # launches.device_of: in a rehearsal, the device a meta tensor stands in for decides the default compute dtype
    return route.orthogonalize.direct(group, launches.device_of(member), rows, cols, fused)


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
