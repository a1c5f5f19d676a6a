"""The group option cuda_graphs (optimizers/graphs.py): which groups and megabatches are captured, the
plan's eager / capture / replay sequence, a failed capture left eager, the streams' assignment, and the
option's check. The CUDA graphs themselves: tests/test_perf_cuda.py (bitwise equal to eager on a GPU)."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from optimizers import Muon, graphs, plan
from optimizers import gram_newton_schulz as gram
from optimizers import ADAMW, DION2, MUON, NORMUON
from optimizers.algorithms.muon import orthogonalize_group

SHAPES = ((6, 10), (6, 10), (10, 6), (4, 3, 2, 2))


def make(seed=0, **options):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in SHAPES]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)
    return Muon(ps, flatten=True, **options), ps


def regrad(ps, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)


PLAIN = dataclasses.replace(MUON, orthogonalize=orthogonalize_group)
"""Muon with its orthogonalize stage replaced by the plain function the stock record runs: it declares nothing."""


@pytest.mark.parametrize("algorithm, orthogonalizer, expected", [
    (MUON, "polar_express", True), (MUON, "newton_schulz", True), (NORMUON, "polar_express", True),
    (MUON, "gram_newton_schulz", True), (MUON, "svd", False), (DION2, "polar_express", False),
    (ADAMW, "polar_express", False), (PLAIN, "polar_express", False)])
def test_which_groups_are_captured(algorithm, orthogonalizer, expected):
    """A group's megabatches may be captured when it asks for graphs and its stages declare a whole select and
    an orthogonalize stage that reads only and is captured for its orthogonalizer."""
    p = torch.nn.Parameter(torch.zeros(4, 6))
    group = Muon([p], orthogonalizer=orthogonalizer, cuda_graphs=True).param_groups[0]
    assert plan.paths(algorithm, group).graphs is expected
    assert plan.paths(algorithm, {**group, "cuda_graphs": None}).graphs is expected
    assert plan.paths(algorithm, {**group, "cuda_graphs": False}).graphs is False


@pytest.mark.parametrize("numel, expected", [(60, True), (graphs.MAX_NUMEL, True), (graphs.MAX_NUMEL + 1, False),
                                             (0, False)])
def test_which_stacks_are_captured(numel, expected):
    """cuda_graphs=None captures stacks of 1 to MAX_NUMEL elements; True any non-empty one."""
    assert graphs.fits(numel) is expected
    assert graphs.fits(numel, every=True) is (numel > 0)


def test_nothing_is_captured_off_cuda():
    assert not graphs.capturable(torch.zeros(2, 3, 4))


CAPTURES: list = []


def fake_capture(self, members):
    """A CUDA graph's stand-in on CPU: "capture" runs each member's update eagerly, Gram's checks
    deferred, as under a real capture; "replay" (fake_replay) reruns every captured member into its
    fixed output buffer."""
    CAPTURES.extend(tuple(m.input.shape) for m in members)
    for m in members:
        with gram.deferred_checks() as m.checks:
            m.output = m.run()
    self.graph = "captured"


def fake_replay(self):
    for m in self.members.values():
        if m is not None:
            with gram.deferred_checks() as m.checks:
                m.output.copy_(m.run())


@pytest.fixture
def fake_cuda(monkeypatch):
    CAPTURES.clear()
    monkeypatch.setattr(graphs.PlanGraphs, "_capture", fake_capture)
    monkeypatch.setattr(graphs.PlanGraphs, "_replay", fake_replay)
    monkeypatch.setattr("optimizers.plan.capturable", lambda stack, every=False: graphs.fits(stack.numel(), every))


def test_a_plan_runs_eagerly_then_captures_then_replays_with_the_eager_results(fake_cuda):
    with_graphs, ps = make(cuda_graphs=True)
    eager, qs = make(cuda_graphs=False)
    for step in range(5):
        with_graphs.step()
        eager.step()
        assert all(torch.equal(p, q) for p, q in zip(ps, qs)), step
        regrad(ps, step)
        regrad(qs, step)
        if step == 1:  # step 0 created the state (a new plan at step 1): nothing captured yet
            assert CAPTURES == []
    # step 2 captured the plan's 3 megabatches ((6, 10) x2, (10, 6), the conv) in one graph; steps 3, 4 replayed
    assert CAPTURES == [(2, 6, 10), (1, 10, 6), (1, 4, 3, 2, 2)]
    plan_graphs = with_graphs._cached.graphs
    assert plan_graphs.replays == 3 and None not in plan_graphs.members.values() and len(plan_graphs.members) == 3


def test_a_block_megabatch_takes_its_norms_eagerly_and_from_its_buffer_in_the_graph(fake_cuda):
    """The norms the momentum launch formed reach the update of a megabatch whose directions are the rows of one
    block (the buffers they are the norms of): eagerly, at the capture, and at each replay from the member's own
    buffer, refreshed before it; a stack of other tensors takes none (they are not its norms)."""
    seen = []

    def update(stack, norms=None):
        seen.append(None if norms is None else norms.tolist())
        return stack * 2.0
    block = torch.randn(2, 3, 4)
    rows, loose = list(block.unbind(0)), [torch.randn(3, 4) for _ in range(2)]
    plan_graphs = graphs.PlanGraphs()
    norms = torch.tensor([1.0, 2.0])
    assert torch.equal(plan_graphs.submit((0, 0), update, rows, lambda s: True, norms), block * 2.0)  # eager
    plan_graphs.armed = True
    for step in (2, 3):  # captured, then replayed
        assert plan_graphs.submit((0, 0), update, rows, lambda s: True, norms * step) is None
        assert plan_graphs.submit((0, 1), update, loose, lambda s: True, norms) is None
        out = plan_graphs.flush()
        assert torch.equal(out[(0, 0)], block * 2.0) and torch.equal(out[(0, 1)], torch.stack(loose) * 2.0)
    # eager; the capture, then its first replay; the next replay
    assert seen == [[1.0, 2.0], [2.0, 4.0], None, [2.0, 4.0], None, [3.0, 6.0], None]


def test_an_uncapturable_block_runs_eagerly_on_itself_with_its_norms(fake_cuda):
    """A block megabatch the plan's graph cannot take (cuda_graphs=None past MAX_NUMEL) runs eagerly at every step
    on the block itself, with the momentum launch's norms, as the eager plan runs it (cuda_graphs=False): no
    stack copy (9.5 ms a step on the 24-layer set, docs/performance.md section 17), the same bits."""
    seen = []

    def update(stack, norms=None):
        seen.append((stack, None if norms is None else norms.tolist()))
        return stack * 2.0
    block = torch.randn(2, 3, 4)
    rows = list(block.unbind(0))
    plan_graphs = graphs.PlanGraphs()
    for step in range(3):
        out = plan_graphs.submit((0, 0), update, rows, lambda s: False, torch.tensor([1.0, 2.0]))
        assert torch.equal(out, block * 2.0), step
        plan_graphs.armed = True
    assert [s is block for s, _ in seen] == [True] * 3 and [n for _, n in seen] == [[1.0, 2.0]] * 3
    assert plan_graphs.members == {(0, 0): None} and plan_graphs.flush() == {} and CAPTURES == []


def test_a_new_plan_starts_without_graphs(fake_cuda):
    opt, ps = make(cuda_graphs=True)
    for _ in range(3):
        opt.step()
    old = opt._cached.graphs
    assert len(old.members) == 3 and old.graph is not None
    opt.param_groups[0]["momentum"] = 0.9
    opt.step()
    assert opt._cached.graphs is not old and opt._cached.graphs.members == {} and opt._cached.graphs.graph is None


def test_an_ineligible_orthogonalizer_stays_eager(fake_cuda):
    """SVD's group never enters the plan's graph: its megabatches run eagerly, none submitted."""
    opt, ps = make(cuda_graphs=True, orthogonalizer="svd")
    for _ in range(4):
        opt.step()
    assert CAPTURES == [] and opt._cached.graphs.members == {} and opt._cached.graphs.graph is None


def test_cuda_graphs_is_a_group_option(fake_cuda):
    """Two groups of one optimizer, one asking for graphs: only its megabatches are captured, the other's run
    eagerly beside the replay, and every parameter steps as with no graph at all."""
    def two_groups(graphed):
        g = torch.Generator().manual_seed(3)
        ps = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in SHAPES]
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g)
        opt = Muon([{"params": ps[:2], "cuda_graphs": graphed}, {"params": ps[2:], "cuda_graphs": False}],
                   flatten=True)
        return opt, ps
    with_graphs, ps = two_groups(True)
    eager, qs = two_groups(False)
    for step in range(4):
        with_graphs.step()
        eager.step()
        regrad(ps, step)
        regrad(qs, step)
    assert all(torch.equal(p, q) for p, q in zip(ps, qs))
    assert CAPTURES == [(2, 6, 10)] and set(with_graphs._cached.graphs.members) == {(0, 0)}
    assert eager._cached.graphs.members == {} and with_graphs._cached.graphs.replays == 2


def test_gram_is_captured_with_its_divergence_check_after_the_replay(fake_cuda, monkeypatch):
    """Gram Newton-Schulz under a graph: the same results and Gram counts as eager; when a result
    diverges (every one, with DIVERGED at 0), the replay's flag sends the megabatch to the eager
    update, whose standard-iteration fallback gives eager's results and counts."""
    for diverged in (gram.DIVERGED, 0.0):
        monkeypatch.setattr(gram, "DIVERGED", diverged)
        with_graphs, ps = make(cuda_graphs=True, orthogonalizer="gram_newton_schulz")
        eager, qs = make(cuda_graphs=False, orthogonalizer="gram_newton_schulz")
        counts = []
        for opt in (with_graphs, eager):
            with pytest.warns(RuntimeWarning) if diverged == 0.0 else contextlib.nullcontext():
                for _ in range(5):
                    opt.step()
            counts.append((opt.stats.gram, opt.stats.fallbacks))
        assert all(torch.equal(p, q) for p, q in zip(ps, qs))
        assert counts[0] == counts[1] and counts[0][0] > 0, counts
        assert counts[0][1] == (counts[0][0] if diverged == 0.0 else 0)
        assert with_graphs._cached.graphs.replays == 3


def steps_alike(steps: int):
    """Step Muon(cuda_graphs=True) and the eager Muon side by side on the same set; every parameter
    bitwise equal after `steps` steps. Returns the one with graphs."""
    with_graphs, ps = make(cuda_graphs=True)
    eager, qs = make(cuda_graphs=False)
    for _ in range(steps):
        with_graphs.step()
        eager.step()
    assert all(torch.equal(p, q) for p, q in zip(ps, qs))
    return with_graphs


def test_a_failed_capture_leaves_the_plan_eager_and_the_step_complete(fake_cuda, monkeypatch):
    def refuse(self, members):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(graphs.PlanGraphs, "_capture", refuse)
    with pytest.warns(RuntimeWarning, match="capturing the step's CUDA graph failed .*operation not permitted"):
        with_graphs = steps_alike(4)
    plan_graphs = with_graphs._cached.graphs
    assert len(plan_graphs.failures) == 1 and "operation not permitted" in plan_graphs.failures[0]
    assert with_graphs.stats.capture_failures == 1
    assert set(plan_graphs.members.values()) == {None} and len(plan_graphs.members) == 3 and plan_graphs.replays == 0


def test_off_cuda_the_option_changes_nothing():
    with_graphs = steps_alike(3)
    assert set(with_graphs._cached.graphs.members.values()) == {None} and with_graphs._cached.graphs.graph is None


def test_cuda_graphs_must_be_none_or_a_bool():
    p = torch.nn.Parameter(torch.zeros(3, 3))
    with pytest.raises(TypeError, match=r"param group 0: cuda_graphs must be None, True or False, got 'yes'"):
        Muon([p], cuda_graphs="yes")
    opt = Muon([p])
    with pytest.raises(TypeError, match=r"param group 1: cuda_graphs must be None, True or False"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, 3))], "cuda_graphs": 1})
    assert len(opt.param_groups) == 1


def test_a_megabatch_of_fresh_momentum_buffers_is_captured_reading_their_block(fake_cuda):
    """Without Nesterov the directions of a megabatch whose momentum buffers are one block (the rows
    created together, plan.momentum_block) are that block: the graph reads it where it lies, no copy."""
    opt, ps = make(cuda_graphs=True)
    for step in range(4):
        opt.step()
        regrad(ps, step)
    pair = opt._cached.graphs.members[(0, 0)]
    assert pair.static and pair.input is opt.state[ps[0]]["momentum_buffer"]._base
    assert not opt._cached.graphs.members[(0, 1)].static  # one member: its own buffer, copied into the input


def test_a_variant_that_writes_its_input_never_sees_the_live_block(fake_cuda):
    """A replaced orthogonalize stage is not captured and gets a fresh stack: its in-place writes
    cannot reach the momentum buffers."""
    def scribble(mats, group):
        return mats.mul_(0.0).add_(1.0)

    variant = dataclasses.replace(MUON, orthogonalize=scribble)
    opt, ps = make(cuda_graphs=True, algorithm=variant, momentum=0.5)
    for _ in range(3):
        opt.step()
    assert all(opt.state[p]["momentum_buffer"].abs().max() > 0.01 for p in ps)
    assert all(not opt.state[p]["momentum_buffer"].eq(1.0).all() for p in ps)


@pytest.mark.parametrize("sizes, count, expected", [
    ([5, 1, 4, 3, 2], 2, [0, 0, 1, 1, 0]),  # 5 -> 0; 4 -> 1; 3 -> 1 (4 < 5); 2 -> 0 (7 > 5); 1 -> 0 (7 = 7: the lower)
    ([3, 3, 3], 4, [0, 1, 2]),
    ([1, 2, 3], 1, [0, 0, 0]),
])
def test_megabatches_go_largest_first_to_the_least_loaded_stream(sizes, count, expected):
    assert graphs.lanes(sizes, count) == expected


def test_graph_results_are_applied_after_the_replay(fake_cuda, monkeypatch):
    """The replay runs once per step, after every megabatch is submitted (each update reads its input then),
    and before any graph member's result is applied; the parameters move."""
    from optimizers import plan
    events = []
    replay, apply = graphs.PlanGraphs._replay, plan._apply
    monkeypatch.setattr(graphs.PlanGraphs, "_replay", lambda self: (events.append("replay"), replay(self)))
    monkeypatch.setattr(plan, "_apply", lambda *args: (events.append("apply"), apply(*args)))
    opt, ps = make(cuda_graphs=True)
    for step in range(3):
        opt.step()
        regrad(ps, step)
    before = [p.clone() for p in ps]
    events.clear()
    opt.step()
    assert events == ["replay", "apply", "apply", "apply"]
    assert all(not torch.equal(p, q) for p, q in zip(ps, before))


def steps_as_eager(opt, ps, steps=4):
    """`steps` steps of `opt` over `ps` beside an eager optimizer (cuda_graphs=False) made alike: the same bits."""
    eager, qs = make(cuda_graphs=False)
    for step in range(steps):
        opt.step()
        eager.step()
        regrad(ps, step)
        regrad(qs, step)
    assert all(torch.equal(p, q) for p, q in zip(ps, qs))


def test_by_default_the_small_stacks_are_captured_and_a_large_one_only_under_true(fake_cuda, monkeypatch):
    """cuda_graphs=None (the default) captures the stacks of up to MAX_NUMEL elements, True every stack: with
    MAX_NUMEL at 60 elements the (10, 6) and conv stacks are captured by both, the (2, 6, 10) stack only under
    True; each steps as the eager optimizer does."""
    monkeypatch.setattr(graphs, "MAX_NUMEL", 60)
    captured = {}
    for option in (None, True):
        CAPTURES.clear()
        steps_as_eager(*(make() if option is None else make(cuda_graphs=True)))
        captured[option] = list(CAPTURES)
    assert captured == {None: [(1, 10, 6), (1, 4, 3, 2, 2)], True: [(2, 6, 10), (1, 10, 6), (1, 4, 3, 2, 2)]}


def test_a_step_the_caller_captures_records_eagerly_into_the_callers_graph(fake_cuda, monkeypatch):
    """While the caller's stream is capturing, the plan's graph is neither captured nor replayed (captures do not
    nest): every megabatch runs eagerly, as the caller's capture records it; once the caller's capture ends the
    plan captures its own graph as usual."""
    monkeypatch.setattr("optimizers.muon.caller_capturing", lambda: True)
    opt, ps = make()
    steps_as_eager(opt, ps)
    assert CAPTURES == [] and opt._cached.graphs.members == {} and opt._cached.graphs.replays == 0
    monkeypatch.setattr("optimizers.muon.caller_capturing", lambda: False)
    opt.step()
    assert len(CAPTURES) == 3


def test_off_cuda_nobody_captures():
    assert graphs.caller_capturing() is False
