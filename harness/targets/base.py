"""The protocol by which the harness judges an optimizer: a `Target`.

A target runs a case's parameters through its optimizer and returns the
trajectory; it declares the conventions it follows (so the reference matches
them) and answers "unsupported" for what it cannot run. Write an adapter by
subclassing `OptimizerTarget` (for any torch.optim.Optimizer) or `Target`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Mapping, Sequence

import torch
from torch.distributed.tensor import DTensor

from cases import Case
from harness.targets.identity import module_identity
from oracles import Conventions


class Target(ABC):
    """An implementation under judgement.

    Attributes:
      name: short name shown in reports.
      exact_relations: True if a megabatched run and the runs of its members alone
        use the same arithmetic, so that in fp64 they must agree bitwise.
      exact_equivalents: True if its runs of two algorithms' equivalent cases (Dion2 with fraction 1
        and Muon: the `fraction1` check) use the same arithmetic, so that in fp64 they must agree
        bitwise; otherwise they agree within the case's tolerance (two code paths may round apart).
    """

    name: str = "target"
    exact_relations: bool = False
    exact_equivalents: bool = False

    def version(self) -> str:
        """What is known of the implementation's version, shown in reports: by default the identity of the
        module that defines this class (its installed distribution and version, its git commit and whether
        the checkout is dirty; harness/targets/identity.py). An adapter of someone else's optimizer
        overrides it to name that optimizer's version."""
        return module_identity(type(self).__module__).describe()

    @abstractmethod
    def conventions(self, case: Case) -> Conventions:
        """The conventions this target follows when running `case`."""

    def unsupported(self, case: Case) -> str | None:
        """Why this target cannot run `case`, or None if it can."""
        return None

    def defaults(self, optimizer: str) -> Mapping[str, Any] | None:
        """The documented defaults of this target's `optimizer` (a `Case.optimizer`), as the `Case` fields they
        set (momentum, nesterov, weight_decay, adjust_lr, flatten, orthogonalizer, beta2, ef_decay, fraction;
        param_dtype and compute_dtype where the defaults fix them), or None: none declared (the default).

        Where they are declared, the target's own tier adds cases holding them whose `construct` is
        "defaults" (harness/running/selection.py: `defaults_rows`); the adapter builds such a case's
        optimizer passing none of the declared options, so that it takes its own defaults, and a changed
        default fails the case."""
        return None

    @abstractmethod
    def run(self, params: Sequence[torch.Tensor], grads: Sequence[Sequence[torch.Tensor]],
            case: Case) -> list[list[torch.Tensor]]:
        """Step the parameters `params` (one megabatch: same shape and dtype) through
        `grads[k][i]` (gradient of parameter i at step k) with `case`'s hyper-parameters,
        all in one optimizer group. Returns `out[k][i]`, parameter i after step k.
        Must not modify its inputs."""


class OptimizerTarget(Target):
    """A target that is a torch.optim.Optimizer built by `make`."""

    @abstractmethod
    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        """An optimizer over `params` configured for `case`."""

    def run(self, params: Sequence[torch.Tensor], grads: Sequence[Sequence[torch.Tensor]],
            case: Case) -> list[list[torch.Tensor]]:
        return step_through(self.make, params, grads, case, lambda t: t.detach().clone())


def step_through(make: Callable[[list[torch.nn.Parameter], Case], torch.optim.Optimizer],
                 params: Sequence[torch.Tensor], grads: Sequence[Sequence[torch.Tensor]], case: Case,
                 place: Callable[[torch.Tensor], torch.Tensor]) -> list[list[torch.Tensor]]:
    """The one loop that steps a case, on one process or on each rank of a layout: parameters
    `place(params[i])` (a copy, or this rank's piece), the optimizer `make` builds over them, gradients
    `place(grads[k][i])` at step k; returns out[k][i], this process's (local) piece of member i after
    step k, a copy."""
    live = [torch.nn.Parameter(place(p)) for p in params]
    optimizer = make(live, case)
    trajectory = []
    for step_grads in grads:
        for p, g in zip(live, step_grads):
            p.grad = place(g)
        optimizer.step()
        trajectory.append([(p.to_local() if isinstance(p, DTensor) else p).detach().clone() for p in live])
    return trajectory


Maker = Callable[[list[torch.nn.Parameter], Case, Any], torch.optim.Optimizer]


def distributed_maker(target: Target) -> Maker | None:
    """How `target` builds an optimizer over distributed parameters: its `make_distributed(params,
    case, mesh)` (the one protocol method, ours and third-party alike), None if it has none."""
    return getattr(target, "make_distributed", None)


def why_unsupported(target: Target, case: Case) -> str | None:
    """Why `target` cannot run `case` over its layout, or None (one process needs only `target.run`)."""
    if case.world_size > 1 and distributed_maker(target) is None:
        return f"target {target.name} has no distributed adapter (a make_distributed(params, case, mesh) method)"
    if case.tensor_parallel is not None and not getattr(target, "tensor_parallel", False):
        return (f"target {target.name} declares no tensor-parallel semantics (tp_mode, num_heads; set "
                f"`tensor_parallel = True` on an adapter that takes them from the case)")
    return target.unsupported(case)
