"""One CUDA graph per plan for its megabatch orthogonalizations (the group option `cuda_graphs`).

A polynomial orthogonalization of one megabatch is ~30 kernel launches (normalise, then per step
X Xᵀ, bA + cA², and the product with X); on sets of many small matrices (GPT-2 small, ConvNeXt) a
step is bound by the host issuing them, and each small kernel leaves most of the GPU idle. So a plan's
capturable megabatches are captured together, once, into one CUDA graph whose updates are spread over
`STREAMS` side streams (forked from the capturing stream and joined back): the graph is one launch a
step, and the GPU runs the megabatches' small kernels side by side. Each megabatch reads a fixed input
buffer (its stacked directions are written into it before the replay; or, when the directions are the
rows of one momentum block (optimizers/plan.py's momentum_block, Muon without Nesterov), the block
itself, read where it lies, with the norms the momentum launch formed of it in a buffer of its own,
refreshed before the replay, as the eager step divides by them) and writes a fixed output buffer (read by
the step's apply before the next replay, which comes only in the next step, on the same stream).

Captured: a megabatch in one process (no exchange) on CUDA of a group whose cuda_graphs is not False, whose
matrix stages select every matrix whole and declare an orthogonalize stage that reads only its input and that a
graph may capture (optimizers/algorithms/stages.py `Orthogonalize.captured`: Muon's and NorMuon's, with an
orthogonalizer in optimizers.algorithms.muon.CAPTURED, and wrappings of it), with at most `MAX_NUMEL` elements
per stack under cuda_graphs=None (above that the GPU is the bound and a graph would only hold memory; True
captures any size); optimizers/plan.py decides it (`Paths.graphs`, `capturable`). Gram Newton–Schulz reads a
divergence flag on the host, which a graph cannot: under capture it records each megabatch's flags on the
device instead (gram_newton_schulz.deferred_checks), and they are read together after the replay, before any
result is applied (one synchronisation per step; eager reads one per megabatch, behind the next megabatch's
work: optimizers/plan.py `Pending`); a megabatch whose matrices diverged is recomputed eagerly, where the
standard-iteration fallback runs.
Not captured: SVD (cuSOLVER checks its info on the host), undeclared stages and every other algorithm;
these run eagerly. A graph replays exactly the kernels the eager calls run, on the same inputs, each
megabatch's in its own order on one stream, so its results are the eager ones bit for bit.

The graph belongs to one validated plan (optimizers/plan.py): a new plan (a changed parameter, option or
state entry) starts with none. A plan's first step runs eagerly; its second captures (after two
warm-up runs of the same streams, as torch's CUDA-graph notes ask); later steps replay. A capture that
fails leaves the plan eager for its lifetime, warns and counts (`Stats.capture_failures`): the step still
completes (its checks ran before). A step the caller is itself capturing (`caller_capturing`) runs eagerly
into the caller's graph.

Measured on one H200 (torch 2.11; docs/performance.md §4):
every capturable megabatch of ConvNeXt-T (17) in one graph took 2.59 ms on one stream, 2.04 / 1.83 /
1.88 ms on 2 / 4 / 8 (Polar Express; Gram Newton–Schulz 2.71, 1.89, 1.57, 1.51); GPT-2 small's 4
megabatches 4.50, 4.37, 4.59, 4.50 ms (Gram: 3.31, 3.09, 3.07, 3.13).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from optimizers import counters
from optimizers import gram_newton_schulz as gram

MAX_NUMEL = 1 << 25
"""Largest stack (elements) captured: 32 Mi elements, e.g. 12 GPT-2 MLP matrices 3072 x 768 (28 Mi)."""

STREAMS = 4
"""Side streams a plan's graph spreads its megabatches over (the fastest or within 4% of it in the
measurements above)."""

WARMUP = 2
"""Eager runs of the forked streams before a capture."""

Key = tuple[int, int]
Update = Callable[[torch.Tensor], torch.Tensor]


def capturable(stack: torch.Tensor, every: bool = False) -> bool:
    """True when a megabatch update of `stack`, of a group whose stages a graph may capture (optimizers/plan.py
    `Paths.graphs`), may be captured: on CUDA, and `fits`."""
    return stack.device.type == "cuda" and fits(stack.numel(), every)


def fits(numel: int, every: bool = False) -> bool:
    """The device-free part of `capturable`: a stack of 1 to MAX_NUMEL elements (cuda_graphs=None), or of
    any size from 1 (`every`: cuda_graphs=True)."""
    return 0 < numel and (every or numel <= MAX_NUMEL)


def caller_capturing() -> bool:
    """True while the current CUDA stream is being captured by the caller (a training step captured whole, as
    torch's CUDA-graph notes show): a plan's own graph is then neither captured nor replayed (a capture cannot
    nest), and its megabatches are recorded eagerly into the caller's graph."""
    return torch.cuda.is_available() and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


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


def lanes(sizes: list[int], count: int) -> list[int]:
    """The stream of each megabatch: the largest first, each to the least loaded of `count` streams
    (by elements; ties to the lowest index)."""
    load, out = [0] * count, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        lane = min(range(count), key=load.__getitem__)
        out[i], load[lane] = lane, load[lane] + sizes[i]
    return out


@dataclass
class Member:
    """One megabatch of the plan's graph: `update` reads `input` (its own buffer, or with `static` the live
    momentum block) and, where given, the matrices' norms in its own buffer `norms` (written before each
    replay), and writes `output`; `checks` holds its Gram divergence flags of the last run."""

    update: Update
    input: torch.Tensor
    static: bool
    norms: torch.Tensor | None = None
    output: torch.Tensor | None = None
    checks: gram.DeferredChecks | None = None

    def run(self) -> torch.Tensor:
        """The update of its input (with its norms buffer, where it has one)."""
        return self.update(self.input) if self.norms is None else self.update(self.input, norms=self.norms)


class PlanGraphs:
    """The graph of one plan and its megabatches by (group index, megabatch index); a `None` member runs
    eagerly (not capturable, or the capture failed). `armed` turns true after the plan's first step.

    Per step: `submit` each megabatch (an eager result comes back at once; a graph member's comes from
    `flush`), then `flush` once: it replays the graph (capturing it first, on the plan's second step), reads
    the Gram divergence flags of every member at once and returns each member's result."""

    def __init__(self) -> None:
        self.members: dict[Key, Member | None] = {}
        self.graph: torch.cuda.CUDAGraph | None = None
        self.replays = 0
        self.armed = False
        self.failures: list[str] = []
        self._waiting: dict[Key, Member] = {}

    def submit(self, key: Key, update: Update, directions: list[torch.Tensor],
               eligible: Callable[[torch.Tensor], bool], norms: torch.Tensor | None = None) -> torch.Tensor | None:
        """The megabatch's update of `directions` now (eager), or None: it waits for `flush`. `norms`: the
        directions' norms, which the update takes where the directions are the rows of one block (the momentum
        buffers the norms are of: optimizers/plan.py `takes_norms`), as the eager step does."""
        member = self.members.get(key, False)
        block = stacked_block(directions)  # an uncapturable block runs eagerly below, on itself, as plan.execute's
        given = None if block is None else norms
        if member:
            # not as captured (another block, or norms where none were captured, or none where they were): eager
            if (member.static and block is not member.input) or (member.norms is None) != (given is None):
                return Member(update, torch.stack(directions) if block is None else block, False, given).run()
            if not member.static:
                torch.stack(directions, out=member.input)
            if given is not None:
                member.norms.copy_(given)
            self._waiting[key] = member
            return None
        stack = torch.stack(directions) if block is None else block
        eager = Member(update, stack, static=block is not None, norms=given)
        if member is None or not self.armed or self.graph is not None:
            return eager.run()
        if not eligible(stack):
            self.members[key] = None
            return eager.run()
        # a fresh stack is its own buffer; the norms get one
        self._waiting[key] = Member(update, stack, eager.static, None if given is None else given.clone())
        return None

    def flush(self) -> dict[Key, torch.Tensor]:
        """Every waiting megabatch's result: the graph replayed (captured first when there is none; a failed
        capture runs them eagerly and leaves them eager), diverged Gram results recomputed eagerly."""
        waiting, self._waiting = self._waiting, {}
        if not waiting:
            return {}
        if self.graph is None:
            try:
                self._capture(list(waiting.values()))
            except Exception as exc:  # noqa: BLE001 - an uncapturable plan stays eager; the step goes on
                self.members.update(dict.fromkeys(waiting))
                self.failures.append(f"megabatches {sorted(waiting)}: {type(exc).__name__}: {exc}")
                stats = counters.current()
                if stats is not None:
                    stats.capture_failures += 1
                warnings.warn(f"capturing the step's CUDA graph failed ({self.failures[-1]}); this plan steps "
                              "eagerly (the same bits, more launches)", RuntimeWarning, stacklevel=4)
                return {key: m.run() for key, m in waiting.items()}
            self.members.update(waiting)
        self._replay()
        self.replays += 1
        return self._settle(waiting)

    def _settle(self, waiting: dict[Key, Member]) -> dict[Key, torch.Tensor]:
        """The members' outputs, but for those whose Gram flags say a matrix diverged: recomputed eagerly
        (one synchronisation for all flags), where the fallback runs and counts; the others' Gram matrices are
        counted in the current counting scope (optimizers/counters.py)."""
        out = {key: m.output for key, m in waiting.items()}
        stats = counters.current()
        for (key, m), diverged in zip(waiting.items(), gram.read_flags([m.checks for m in waiting.values()])):
            if diverged:
                out[key] = m.run()
            elif stats is not None:
                stats.gram += m.checks.matrices
        return out

    def _capture(self, members: list[Member]) -> None:
        """Warm up, then capture every member's update into `self.graph`, spread over the side streams."""
        device = members[0].input.device
        side = [torch.cuda.Stream(device) for _ in range(min(STREAMS, len(members)))]
        lane = lanes([m.input.numel() for m in members], len(side))
        for _ in range(WARMUP):
            _forked(members, lane, side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # its own memory pool: the plan has one graph
            _forked(members, lane, side)
        self.graph = graph

    def _replay(self) -> None:
        self.graph.replay()


def _forked(members: list[Member], lane: list[int], side: list[torch.cuda.Stream]) -> None:
    """Each member's update on its side stream (forked from the current stream, joined back), its Gram
    divergence checks recorded on the device, in `member.checks`."""
    origin = torch.cuda.current_stream(side[0].device)
    for stream in side:
        stream.wait_stream(origin)
    for member, index in zip(members, lane):
        with torch.cuda.stream(side[index]), gram.deferred_checks() as checks:
            member.output = member.run()
        member.checks = checks
    for stream in side:
        origin.wait_stream(stream)
