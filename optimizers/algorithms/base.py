"""An optimizer algorithm as one record: its options, its state, and a chain of small stages.

`optimizers.Muon` steps every parameter group by running the stages of the group's
`Algorithm` (a registered name, or a record passed as the group's `algorithm` option).
A variant is a record with one stage replaced, e.g.
`dataclasses.replace(MUON, orthogonalize=my_orthogonalizer)`: no subclassing, no private methods.

One step of a matrix algorithm, for the parameters of one group that have a gradient
(`group` is the group's dict with every option filled in; tensors are this rank's local data:
the local shard of a DTensor, aliasing it, so in-place writes land in the DTensor):

  per parameter     U = direction(G, state, group)                 local; may update state in place
  per megabatch     stack the U of same-shape parameters: [N, *shape] (this rank's pieces)
    matrix update   on whole members [k, *shape], seen as matrices M [B, m, n] (`view(group)`,
                    optimizers.matrix_view.View):
                      S, expand = select(M, group)                  which slices are orthogonalized
                      O = expand(orthogonalize(S, group))           back to [B, m, n]
                      (select None: S = M, every matrix whole, and expand is the identity)
                    single process: run on the stack itself; distributed:
                      exchange(pieces, layout, matrix_update) assembles each whole member on its
                      owner rank, runs the matrix update there, and returns this rank's pieces
                    updates = postprocess(O as [N, *shape], states, group)  local (this rank's rows;
                                                                    postprocess None: updates = O)
  per parameter     apply(X, update, state, group, lr_scale(shape, group))

An elementwise algorithm (AdamW) has `orthogonalize=None`: per parameter,
`apply(X, direction(G, state, group), state, group, lr_scale(shape, group))`, with no matrix
view, megabatch or exchange, so it takes parameters of any rank and any DTensor layout.

Stage signatures (Group = dict[str, Any]; State = the parameter's state dict, values as stored):

  direction(grad: Tensor, state: State, group) -> Tensor          the update direction U, local
  select(mats: Tensor[B, m, n], group) -> (Tensor[B, m', n'], expand)
                                    expand maps the orthogonalized selection back to [B, m, n]
  orthogonalize(mats: Tensor[B, m, n], group) -> Tensor[B, m, n]  same dtype as `mats`
  postprocess(updates: Tensor[N, *local shape], states: list[State], group) -> Tensor (same shape)
  lr_scale(shape: tuple[int, ...] (global), group) -> float
  apply(x: Tensor (local), update: Tensor, state: State, group, scale: float) -> None   in place
  exchange(pieces: Tensor[N, *piece], layout: distributed.Layout,
           matrix_update: Callable[[Tensor[k, *shape]], Tensor[k, *shape]]) -> Tensor[N, *piece]
  validate(where: str, group) -> None      the algorithm's own options and parameter ranks;
                                           ValueError/TypeError naming `where` and the option
  check_layout(where: str, index: int, p: DTensor) -> None   an algorithm's extra DTensor rule
  view(group) -> matrix_view.View          how the group's parameters are seen as matrices (the options
                                           the executor reads of a matrix group)

A stage may be a record that declares what it is (optimizers/algorithms/stages.py: Direction,
Orthogonalize, Apply): the executor then runs the faster forms it declares (batched over many
parameters, fused, captured in a CUDA graph, ...), with the same bits; a plain function runs as
given. Muon's stock stages are such records; `MUON.direction.before(step)` and the like wrap one
and keep the forms whose contract still holds.

`select` and `orthogonalize` see whole matrices (on their owner rank when distributed), so a
selection made from the whole matrix is layout invariant; they are stateless (state updates
belong to `direction` and `postprocess`, which run on every rank on its local data). Stages
must not raise on options and inputs their record's `validate` accepted: every check runs
before the first write of a step.

Non-finite gradients, one policy for every algorithm (torch.optim's): a NaN or +-inf gradient element
is neither detected nor skipped nor repaired. It flows through the stages like any value, so the step
writes non-finite values into the parameter: AdamW the element itself; a matrix algorithm the update
of the whole matrix of the view that holds it (the normaliser divides by a NaN or inf norm); Dion2 and
NorDion2 the selected slices of that matrix, the slice holding it among them (a slice whose L1 norm is
not finite is selected first). It stays in the state, so every later step leaves the parameter
non-finite, and other parameters step exactly as they would without it (each matrix of a stack is
orthogonalized on its own). So no stage may turn a non-finite value finite (a mask or selection by
`> 0`, a `where` on a comparison that NaN fails, a clamp) nor raise on one. Not a skip: knowing
before the first write whether a step is finite takes a device-to-host synchronisation every step
(and, distributed, an agreement among the ranks), which this optimizer otherwise avoids; skipping a
step with an inf or NaN gradient is what torch.amp.GradScaler does, for any optimizer. A checkpoint
whose state is not finite is refused on load (optimizers/checkpoint.py).

State: `state` lists every key a parameter of the algorithm holds, with its shape as a function
of the parameter's global shape and the group (None: a step count, a Python int). Missing keys
are created as zeros before `direction` runs, placed like the parameter (a DTensor with the
parameter's mesh and placements when it is one), in its dtype and device; checkpoints are
validated against the same list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from optimizers import distributed, elementwise, kernels
from optimizers.algorithms.stages import Apply, Group, State
from optimizers.matrix_view import View

Expand = Callable[[torch.Tensor], torch.Tensor]
Select = Callable[[torch.Tensor, Group], tuple[torch.Tensor, Expand]]
Postprocess = Callable[[torch.Tensor, list[State], Group], torch.Tensor]
LrScale = Callable[[tuple[int, ...], Group], float]
Exchange = Callable[[torch.Tensor, distributed.Layout, Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]
Validate = Callable[[str, Group], None]
CheckLayout = Callable[[str, int, torch.Tensor], None]


@dataclass(frozen=True)
class StateKey:
    """One entry of a parameter's state: `shape(param_shape, group)` gives the shape of its tensor,
    placed like the parameter; `shape=None` marks a step count (a non-negative Python int).
    `nonnegative`: every value must be >= 0 (a second moment)."""

    name: str
    shape: Callable[[tuple[int, ...], Group], tuple[int, ...]] | None
    nonnegative: bool = False


def parameter_shape(shape: tuple[int, ...], group: Group) -> tuple[int, ...]:
    """Shape of a state tensor shaped like its parameter."""
    return shape


def unit_lr_scale(shape: tuple[int, ...], group: Group) -> float:
    """lr scale stage of an elementwise algorithm: 1."""
    return 1.0


def decoupled_apply(x: torch.Tensor, update: torch.Tensor, state: State, group: Group, scale: float) -> None:
    """X <- X (1 - lr wd);  X <- X - lr scale update. (No multiply by 1 when wd = 0: same bits.)"""
    if group["weight_decay"]:
        x.mul_(1.0 - group["lr"] * group["weight_decay"])
    x.add_(update, alpha=-group["lr"] * scale)


FOREACH_DTYPES = (torch.float32, torch.float64)
"""dtypes whose torch._foreach_* scalar ops give the per-tensor ops' bits: on CPU a foreach op rounds its
Python scalar to the tensors' dtype first, where the per-tensor op keeps it in fp32 for bf16/fp16."""


def foreach_exact(*lists: list[torch.Tensor]) -> bool:
    """True when every tensor of `lists` has a dtype of FOREACH_DTYPES (module constant's note)."""
    return all(t.dtype in FOREACH_DTYPES for ts in lists for t in ts)


def decoupled_apply_all(xs: list[torch.Tensor], updates: list[torch.Tensor], group: Group, scale: float) -> None:
    """`decoupled_apply` of many parameters sharing one lr scale, with the same bits: one
    torch._foreach_* call per pass (a few kernel launches on CUDA instead of one or two per parameter);
    half-type parameters one by one (FOREACH_DTYPES)."""
    if not xs:
        return
    if not foreach_exact(xs, updates):
        for x, update in zip(xs, updates):
            decoupled_apply(x, update, {}, group, scale)
        return
    if group["weight_decay"]:
        torch._foreach_mul_(xs, 1.0 - group["lr"] * group["weight_decay"])
    torch._foreach_add_(xs, updates, alpha=-group["lr"] * scale)


def decoupled_fuses(xs: list[torch.Tensor], group: Group) -> bool:
    """True when `decoupled_apply_fused` runs optimizers.elementwise's kernel on these parameters (the group's
    `fused` option, optimizers/kernels.py)."""
    return bool(xs) and elementwise.applies(xs, kernels.of(group["fused"], xs[0]))


def decoupled_apply_fused(xs: list[torch.Tensor], matrices: torch.Tensor, group: Group, scale: float) -> bool:
    """`decoupled_apply` of every parameter of a megabatch from its matrices [B, m, n] (the orthogonalized
    matrix view, any strides) by optimizers.elementwise's fused kernel, where it runs (else False: nothing
    done)."""
    decay = 1.0 - group["lr"] * group["weight_decay"] if group["weight_decay"] else None
    return bool(xs) and elementwise.apply_(xs, matrices, decay, -group["lr"] * scale, kernels.of(group["fused"], xs[0]))


DECOUPLED = Apply(decoupled_apply, foreach=decoupled_apply_all, fuses=decoupled_fuses, fused=decoupled_apply_fused,
                  widens=True)
"""The apply stage of the matrix algorithms: decoupled decay, then the update (the torch add_ widens a
bf16/fp16 update exactly), declared with its foreach and fused forms."""


def no_layout_rule(where: str, index: int, p: torch.Tensor) -> None:
    """Layout stage of an algorithm that takes every layout distributed Muon supports."""


def group_view(group: Group) -> View:
    """The view of a group with the matrix options Muon's record defines: flatten, num_heads, tp_mode."""
    return View(group["flatten"], group["num_heads"], group["tp_mode"])


@dataclass(frozen=True, eq=False)
class Algorithm:
    """One optimizer algorithm (see the module docstring for the stages and their signatures).

    name: what groups and checkpoints call it; defaults: its group options and their defaults;
    state: the state keys of each of its parameters. Records compare by identity.
    """

    name: str
    defaults: Mapping[str, Any]
    validate: Validate
    state: tuple[StateKey, ...]
    direction: Callable[[torch.Tensor, State, Group], torch.Tensor]
    orthogonalize: Callable[[torch.Tensor, Group], torch.Tensor] | None
    select: Select | None = None
    postprocess: Postprocess | None = None
    lr_scale: LrScale = unit_lr_scale
    apply: Callable[[torch.Tensor, torch.Tensor, State, Group, float], None] = DECOUPLED
    exchange: Exchange = distributed.exchange
    check_layout: CheckLayout = no_layout_rule
    view: Callable[[Group], View] = group_view

    @property
    def elementwise(self) -> bool:
        """True for an algorithm without matrix stages (AdamW)."""
        return self.orthogonalize is None

    def matrix_update(self, group: Group, shape: tuple[int, ...]) -> Callable[[torch.Tensor], torch.Tensor]:
        """stack [k, *shape] of whole members (or of TP shards under tp_mode="per_shard") -> their
        updates, same shape: matrix view (head blocks of the global `shape` with num_heads), select,
        orthogonalize, expand."""
        view = self.view(group)

        def run(stack: torch.Tensor) -> torch.Tensor:
            if stack.shape[0] == 0:
                return stack
            mats = view.matrices(stack, shape)
            if self.select is None:
                return self.orthogonalize(mats, group).reshape(stack.shape)
            selected, expand = self.select(mats, group)
            return expand(self.orthogonalize(selected, group)).reshape(stack.shape)
        return run

    def __repr__(self) -> str:
        return f"Algorithm({self.name!r})"
