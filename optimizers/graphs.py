"""CUDA graphs of small megabatch orthogonalizations (`Muon(cuda_graphs=True)`): fewer launches.

A polynomial orthogonalization of one megabatch is ~30 kernel launches (normalise, then per step
X Xᵀ, bA + cA², and the product with X); on sets of many small matrices (GPT-2 small, ConvNeXt) a
step is bound by the host issuing them, not by the GPU. A CUDA graph captures one megabatch's whole
matrix update once and replays it as one launch, reading a fixed input buffer (the stacked
directions are written into it; or, when the directions are the rows of one momentum block
(optimizers/plan.py's momentum_block, Muon without Nesterov), the block itself, read where it lies)
and writing a fixed output buffer (read by the step's apply
before the next replay, which comes only in the next step, on the same stream).

Captured: a megabatch in one process (no exchange) on CUDA, of an algorithm whose matrix stages are
Muon's whole-matrix select and `orthogonalize_group` (Muon, NorMuon), with an orthogonalizer in
`CAPTURED` and at most `MAX_NUMEL` elements per stack (above that the GPU is the bound and a graph
would only hold memory). Gram Newton–Schulz reads a divergence flag on the host, which a graph
cannot: under capture it records the flag on the device instead (gram_newton_schulz.deferred_checks),
and the flags of every replay of a step are read together before their results are applied (one
synchronisation per step, where eager has one per megabatch: `PlanGraphs.settle`); if any matrix of a
megabatch diverged, its whole update is recomputed eagerly, where the standard-iteration fallback runs.
Not captured: SVD (cuSOLVER checks its info on the host) and every other algorithm; these run
eagerly as before. A graph replays exactly the kernels the eager call runs, on the same inputs, so
its result is the eager one bit for bit.

Graphs belong to one validated plan (optimizers/plan.py): a new plan (a changed parameter, option or
state entry) starts with none. A plan's first step runs eagerly; its second captures (after two
warm-up calls on a side stream, as torch's CUDA-graph notes ask); later steps replay. The graphs of a
plan share one memory pool, replayed in the order they were captured. A capture that fails leaves
that megabatch eager for the plan's lifetime: the step still completes (its checks ran before).
"""

from __future__ import annotations

from typing import Callable

import torch

from optimizers import gram_newton_schulz as gram
from optimizers.algorithms.base import Algorithm, select_all
from optimizers.algorithms.muon import orthogonalize_group

CAPTURED = ("polar_express", "newton_schulz", "gram_newton_schulz")
"""Orthogonalizers whose megabatch update can be captured: the polynomials have no host
synchronisation; Gram Newton–Schulz's divergence check is deferred past the replay."""

MAX_NUMEL = 1 << 25
"""Largest stack (elements) captured: 32 Mi elements, e.g. 12 GPT-2 MLP matrices 3072 x 768 (28 Mi)."""

WARMUP = 2
"""Eager calls on a side stream before a capture."""


def capturable(algorithm: Algorithm, group: dict, stack: torch.Tensor) -> bool:
    """True when `group`'s megabatch update of `stack` (one process, no exchange) may be captured:
    on CUDA, and `captures` says so."""
    return stack.device.type == "cuda" and captures(algorithm, group, stack.numel())


def captures(algorithm: Algorithm, group: dict, numel: int) -> bool:
    """The device-free rule (module docstring): Muon's matrix stages, an orthogonalizer in CAPTURED,
    1 to MAX_NUMEL elements."""
    return (algorithm.select is select_all and algorithm.orthogonalize is orthogonalize_group
            and group["orthogonalizer"] in CAPTURED and 0 < numel <= MAX_NUMEL)


def stacked_block(members: list[torch.Tensor]) -> torch.Tensor | None:
    """The block [N, *shape] whose rows 0..N-1 are `members`, in order (views made by `momentum_block`),
    or None (then the members are stacked)."""
    block = members[0]._base
    if block is None or not block.is_contiguous() or tuple(block.shape) != (len(members),) + tuple(members[0].shape):
        return None
    step = members[0].numel() * members[0].element_size()
    for i, m in enumerate(members):
        if m._base is not block or m.data_ptr() != block.data_ptr() + i * step or not m.is_contiguous():
            return None
    return block


class Graphed:
    """`update` captured for stacks of one shape, dtype and device: `run(directions)` stacks them into
    the input buffer, replays, and returns the output buffer (valid until the next replay); with `checked`,
    the replay's Gram divergence flags must be read before that output is used (PlanGraphs.settle)."""

    def __init__(self, update: Callable[[torch.Tensor], torch.Tensor], example: torch.Tensor,
                 pool: tuple, static: bool = False) -> None:
        self.static = static  # `example` is the live momentum block (stacked_block): read where it lies
        self.input = example if static else example.clone()
        self.replays = 0
        self.checks = self._capture(update, pool)

    def _capture(self, update: Callable[[torch.Tensor], torch.Tensor], pool: tuple) -> gram.DeferredChecks:
        """Warm up on a side stream, then capture into `self.graph`, writing `self.output`."""
        side, main = torch.cuda.Stream(self.input.device), torch.cuda.current_stream(self.input.device)
        side.wait_stream(main)
        with gram.deferred_checks(), torch.cuda.stream(side):  # warm-ups are not counted in gram.STATS
            for _ in range(WARMUP):
                update(self.input)
        main.wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with gram.deferred_checks() as checks, torch.cuda.graph(self.graph, pool=pool):
            self.output = update(self.input)
        return checks

    def _replay(self) -> None:
        self.graph.replay()

    def run(self, directions: list[torch.Tensor]) -> torch.Tensor:
        """Replay on `directions`; the output is checked later (`checked`, `PlanGraphs.settle`)."""
        if not self.static:
            torch.stack(directions, out=self.input)
        self._replay()
        self.replays += 1
        return self.output

    @property
    def checked(self) -> bool:
        """True when the replay records divergence flags (Gram Newton–Schulz) to read before its output is used."""
        return bool(self.checks.flags)


class PlanGraphs:
    """The graphs of one plan, by (group index, megabatch index); `None` marks an eager megabatch
    (not capturable, or its capture failed). `armed` turns true after the plan's first step.

    A replay whose graph records Gram divergence flags is `pending` until `settle` reads the flags of every
    pending replay of the step at once: one host synchronisation per step, not one per megabatch (the
    caller applies a pending result only after `settle`; each graph's output buffer holds it until then)."""

    def __init__(self) -> None:
        self.graphs: dict[tuple[int, int], Graphed | None] = {}
        self.armed = False
        self.pool: tuple | None = None
        self.failures: list[str] = []
        self._pending: dict[tuple[int, int], tuple[Graphed, Callable[[torch.Tensor], torch.Tensor]]] = {}

    def pending(self, key: tuple[int, int]) -> bool:
        """True when megabatch `key`'s result of this step waits for `settle`."""
        return key in self._pending

    def settle(self) -> dict[tuple[int, int], torch.Tensor]:
        """Read the divergence flags of every pending replay (one synchronisation); returns, for each
        megabatch whose Gram result diverged, its update recomputed eagerly (where the standard-iteration
        fallback runs). The others' outputs stand, and their matrices are counted in gram.STATS."""
        pending, self._pending = self._pending, {}
        if not pending:
            return {}
        flags = torch.stack([torch.stack(g.checks.flags).any() for g, _ in pending.values()]).tolist()
        out = {}
        for (key, (graphed, update)), diverged in zip(pending.items(), flags):
            if diverged:
                out[key] = update(graphed.input)
            else:
                gram.STATS.gram += graphed.checks.matrices
        return out

    def run(self, key: tuple[int, int], update: Callable[[torch.Tensor], torch.Tensor],
            directions: list[torch.Tensor], eligible: Callable[[torch.Tensor], bool]) -> torch.Tensor:
        """The megabatch's update of `directions`: replayed, captured now, or eager."""
        graphed = self.graphs.get(key, False)
        block = stacked_block(directions)
        if block is not None and not eligible(block):  # only Muon's read-only stages may see the live block
            block = None
        if graphed and graphed.static and block is not graphed.input:  # not the captured block: eager
            return update(torch.stack(directions))
        if graphed:
            return self._replayed(key, graphed, update, directions)
        stack = torch.stack(directions) if block is None else block
        if graphed is None or not self.armed:
            return update(stack)
        if not eligible(stack):
            self.graphs[key] = None
            return update(stack)
        try:
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            graphed = Graphed(update, stack, self.pool, static=block is not None)
        except Exception as exc:  # noqa: BLE001 - an uncapturable update stays eager; the step goes on
            self.graphs[key], self.pool = None, None  # later captures take a fresh pool
            self.failures.append(f"megabatch {key}: {type(exc).__name__}: {exc}")
            return update(stack)
        self.graphs[key] = graphed
        return self._replayed(key, graphed, update, directions)

    def _replayed(self, key: tuple[int, int], graphed: Graphed, update: Callable[[torch.Tensor], torch.Tensor],
                  directions: list[torch.Tensor]) -> torch.Tensor:
        out = graphed.run(directions)
        if graphed.checked:
            self._pending[key] = (graphed, update)
        return out
