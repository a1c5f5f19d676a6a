"""Stage records: stages that declare what they are, so that the step executor may run a faster form of them.

A stage of an `Algorithm` (optimizers/algorithms/base.py) is any callable with the stage's signature. A record
below is one too (calling it runs its `run`), and it also declares the forms the executor (optimizers/plan.py)
may run in its place, each with the bits of `run`, and the facts about `run` those forms rely on. A plain
function declares nothing, and the executor runs it as given, one parameter or one megabatch at a time (the
general path): `dataclasses.replace(MUON, direction=f)` always runs `f` itself. The `select` and `postprocess`
stages declare their absence by None (every matrix whole; nothing after the orthogonalization).

  Direction      run(G, state, group) -> U
                 batched(Gs, states, group) -> (Us, parts): the same Us and state updates for many parameters at
                     once; `parts`: each U's sum of squares in parts [N, P] fp64, where the batched form formed
                     them and each U is its state's `buffer` itself (else None)
                 buffer: the state key (shaped like the parameter) whose tensor U is, when it is (Muon without
                     Nesterov): the executor may create a megabatch's buffers as the rows of one block, so that
                     the stack of their Us is the block itself
  Orthogonalize  run(mats, group, out_dtype=None, norms=None) -> O [B, m, n], in `out_dtype` (default mats')
                 reads_only: `run` never writes `mats` (the executor may hand it the live momentum block)
                 direct(group, device, rows, cols, fused) -> dtype | None: a bf16/fp16 dtype `run` may return O in
                     (`out_dtype`) for parameters on `device` whose matrices are rows x cols: the values O had
                     before the cast to mats' dtype, uncast (None: not for these); `fused`: the apply reads O's
                     matrices where they lie (a tall result's transposed view too)
                 norms(group) -> bool: `run` may be given the Frobenius norms [B] of `mats` (`norms`, at least
                     fp32) and divides by them in place of forming its own
                 captured(group) -> bool: a CUDA graph may capture `run` (no host synchronisation but the Gram
                     divergence checks, which optimizers.gram_newton_schulz.deferred_checks defers)
                 checked(group, rows, cols) -> bool: `run` checks its result on the host (Gram divergence flags):
                     the executor reads that check behind the next megabatch's work
  Apply          run(x, U, state, group, scale), in place
                 foreach(xs, Us, group, scale): the same for many parameters sharing `scale` (reading no state)
                 fuses(xs, group) -> bool: whether `fused` runs on these parameters
                 fused(xs, matrices, group, scale) -> bool: the same from a megabatch's orthogonalized matrices
                     [B, m, n] (any strides; each parameter's consecutive matrices) in one launch where it runs
                     (False: nothing done)
                 widens: a bf16/fp16 U gives the bits of U cast to x's dtype first (so O may stay in its
                     compute dtype: Orthogonalize.direct)

A step before or after a stock stage keeps the fast paths whose contract still holds: wrap the record with its
`before` or `after`, e.g.

    clipped = dataclasses.replace(MUON, direction=MUON.direction.before(clip))

A `before`/`after` step of Direction and Orthogonalize is step(t, group) -> a tensor of t's shape and dtype,
which never writes t (a new tensor, or t itself unchanged); Apply's `after` step writes its parameter in place,
step(x, group) -> None. Every step is made of device operations only (no host synchronisation), so that a CUDA
graph may capture it. Each method says which declarations it keeps.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch

Group = dict[str, Any]
State = dict[str, Any]
Step = Callable[[torch.Tensor, Group], torch.Tensor]
"""A step before or after a stage: step(t, group) -> a tensor of t's shape and dtype (module docstring)."""


def declared(stage: Any, kind: type) -> Any:
    """`stage` when it is a record of `kind` (it declares its forms), else None (a plain function, or None)."""
    return stage if isinstance(stage, kind) else None


@dataclass(frozen=True)
class Direction:
    """A direction stage (G, state, group) -> U that declares its batched form and its buffer (module docstring)."""

    run: Callable[[torch.Tensor, State, Group], torch.Tensor]
    batched: Callable[[list[torch.Tensor], list[State], Group],
                      tuple[list[torch.Tensor], torch.Tensor | None]] | None = None
    buffer: str | None = None

    def __call__(self, grad: torch.Tensor, state: State, group: Group) -> torch.Tensor:
        return self.run(grad, state, group)

    def before(self, step: Step) -> Direction:
        """U = this stage's U of step(G, group): the batched form (every G stepped first) and `buffer` kept."""
        batched = None if self.batched is None else functools.partial(_batched_before, self.batched, step)
        return Direction(functools.partial(_direction_before, self.run, step), batched, self.buffer)

    def after(self, step: Step) -> Direction:
        """U = step(this stage's U, group): the batched form kept, without sums of squares (they are the
        buffers', not the stepped Us'); U is no buffer."""
        batched = None if self.batched is None else functools.partial(_batched_after, self.batched, step)
        return Direction(functools.partial(_direction_after, self.run, step), batched)


def _direction_before(run: Callable, step: Step, grad: torch.Tensor, state: State, group: Group) -> torch.Tensor:
    return run(step(grad, group), state, group)


def _batched_before(batched: Callable, step: Step, grads: list[torch.Tensor], states: list[State],
                    group: Group) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    return batched([step(g, group) for g in grads], states, group)


def _direction_after(run: Callable, step: Step, grad: torch.Tensor, state: State, group: Group) -> torch.Tensor:
    return step(run(grad, state, group), group)


def _batched_after(batched: Callable, step: Step, grads: list[torch.Tensor], states: list[State],
                   group: Group) -> tuple[list[torch.Tensor], None]:
    found, _ = batched(grads, states, group)
    return [step(u, group) for u in found], None


@dataclass(frozen=True)
class Orthogonalize:
    """An orthogonalize stage (mats [B, m, n], group) -> O that declares what the executor's direct apply, CUDA
    graphs and check ordering rely on (module docstring); an undeclared fact (None, False) is not relied on."""

    run: Callable[..., torch.Tensor]
    reads_only: bool = False
    direct: Callable[[Group, torch.device, int, int, bool], torch.dtype | None] | None = None
    norms: Callable[[Group], bool] | None = None
    captured: Callable[[Group], bool] | None = None
    checked: Callable[[Group, int, int], bool] | None = None

    def __call__(self, mats: torch.Tensor, group: Group) -> torch.Tensor:
        return self.run(mats, group)

    def before(self, step: Step) -> Orthogonalize:
        """O = this stage's O of step(mats, group): `reads_only`, `direct`, `captured` and `checked` kept;
        `norms` not (they would be mats', not the stepped matrices')."""
        return Orthogonalize(functools.partial(_orthogonalize_before, self.run, step), self.reads_only, self.direct,
                             None, self.captured, self.checked)

    def after(self, step: Step) -> Orthogonalize:
        """O = step(this stage's O, group): `reads_only`, `captured` and `checked` kept; `direct` and `norms` not
        (the step would see O in the compute dtype instead of mats')."""
        return Orthogonalize(functools.partial(_orthogonalize_after, self.run, step), self.reads_only, None, None,
                             self.captured, self.checked)


def _orthogonalize_before(run: Callable, step: Step, mats: torch.Tensor, group: Group,
                          out_dtype: torch.dtype | None = None) -> torch.Tensor:
    return run(step(mats, group), group, out_dtype)


def _orthogonalize_after(run: Callable, step: Step, mats: torch.Tensor, group: Group) -> torch.Tensor:
    return step(run(mats, group), group)


@dataclass(frozen=True)
class Apply:
    """An apply stage (x, U, state, group, scale) -> None that declares its foreach and fused forms and whether
    it widens a half-precision U exactly (module docstring)."""

    run: Callable[[torch.Tensor, torch.Tensor, State, Group, float], None]
    foreach: Callable[[list[torch.Tensor], list[torch.Tensor], Group, float], None] | None = None
    fuses: Callable[[list[torch.Tensor], Group], bool] | None = None
    fused: Callable[[list[torch.Tensor], torch.Tensor, Group, float], bool] | None = None
    widens: bool = False

    def __call__(self, x: torch.Tensor, update: torch.Tensor, state: State, group: Group, scale: float) -> None:
        self.run(x, update, state, group, scale)

    def after(self, step: Callable[[torch.Tensor, Group], None]) -> Apply:
        """This apply, then step(x, group) on each parameter (in place: a projection, say): every form kept."""
        foreach = None if self.foreach is None else functools.partial(_foreach_after, self.foreach, step)
        fused = None if self.fused is None else functools.partial(_fused_after, self.fused, step)
        return Apply(functools.partial(_apply_after, self.run, step), foreach, self.fuses, fused, self.widens)


def _apply_after(run: Callable, step: Callable, x: torch.Tensor, update: torch.Tensor, state: State, group: Group,
                 scale: float) -> None:
    run(x, update, state, group, scale)
    step(x, group)


def _foreach_after(foreach: Callable, step: Callable, xs: list[torch.Tensor], updates: list[torch.Tensor],
                   group: Group, scale: float) -> None:
    foreach(xs, updates, group, scale)
    for x in xs:
        step(x, group)


def _fused_after(fused: Callable, step: Callable, xs: list[torch.Tensor], matrices: torch.Tensor, group: Group,
                 scale: float) -> bool:
    if not fused(xs, matrices, group, scale):
        return False
    for x in xs:
        step(x, group)
    return True
