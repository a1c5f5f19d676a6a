"""Stages that declare what they are (optimizers/algorithms/stages.py): the executor (optimizers/plan.py) takes a
fast path because a stage declares it, never because the stage is a particular function. A stock stage wrapped
with a step before or after it keeps every fast path whose contract holds (foreach batching, the direct-dtype
apply, the stacked block, CUDA-graph capture, the rehearsal), with the bits of the same composition written as
a plain function; a plain function in a stage's place runs the general path, with the bits it always had."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from optimizers import DION2, MUON, NORMUON, Muon, graphs, plan
from optimizers import gram_newton_schulz as gram
from optimizers.algorithms.base import DECOUPLED, decoupled_apply
from optimizers.algorithms.muon import momentum_direction, orthogonalize_group
from optimizers.algorithms.stages import Apply, Direction, Orthogonalize

SHAPES = ((6, 10), (6, 10), (6, 10), (10, 6), (10, 6), (4, 3, 2, 2), (4, 3, 2, 2))
"""Megabatches of three wide, two tall and two convolutions (flattened)."""


def clip(g, group):
    return g.clamp(-0.5, 0.5)


def sparsify(mats, group):
    return torch.where(mats.abs() < 0.3, torch.zeros((), dtype=mats.dtype), mats)


def project(x, group):
    x.clamp_(-1.2, 1.2)


def double(t, group):
    return t * 2


WRAPPED = {
    "direction before": (dataclasses.replace(MUON, direction=MUON.direction.before(clip)),
                         dataclasses.replace(MUON, direction=lambda g, s, group: momentum_direction(clip(g, group), s,
                                                                                                    group))),
    "orthogonalize before": (dataclasses.replace(MUON, orthogonalize=MUON.orthogonalize.before(sparsify)),
                             dataclasses.replace(MUON, orthogonalize=lambda m, group: orthogonalize_group(
                                 sparsify(m, group), group))),
    "apply after": (dataclasses.replace(MUON, apply=MUON.apply.after(project)),
                    dataclasses.replace(MUON, apply=lambda x, u, s, group, scale: (
                        decoupled_apply(x, u, s, group, scale), project(x, group)))),
}
"""A stock stage wrapped with a step (declared), and the same composition as a plain function (undeclared)."""


def make(algorithm, seed=0, **options):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in SHAPES]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)
    opt = Muon(ps, lr=0.1, flatten=True, weight_decay=0.1, compute_dtype=torch.bfloat16, algorithm=algorithm,
               **options)
    return opt, ps


def regrad(ps, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)


CAPTURES: list = []


def fake_capture(self, members):
    """A CUDA graph's stand-in on CPU (as tests/test_graphs.py's): "capture" runs each member's update with its
    Gram checks deferred; "replay" reruns each into its fixed output buffer."""
    CAPTURES.extend(tuple(m.input.shape) for m in members)
    for m in members:
        with gram.deferred_checks() as m.checks:
            m.output = m.update(m.input)
    self.graph = "captured"


def fake_replay(self):
    for m in self.members.values():
        if m is not None:
            with gram.deferred_checks() as m.checks:
                m.output.copy_(m.update(m.input))


@pytest.fixture
def observed(monkeypatch):
    """Which fast paths the executor takes, on CPU: a fake CUDA graph, the direct apply from any size, and spies
    on the block read as the stack, the direct apply, the apply's foreach form against one parameter at a time,
    and the graph's submissions."""
    CAPTURES.clear()
    monkeypatch.setattr(graphs.PlanGraphs, "_capture", fake_capture)
    monkeypatch.setattr(graphs.PlanGraphs, "_replay", fake_replay)
    monkeypatch.setattr(plan, "capturable", lambda stack, every=False: graphs.fits(stack.numel(), every))
    monkeypatch.setattr(plan, "DIRECT_APPLY_NUMEL", 1)
    seen = dict.fromkeys(("block", "direct", "foreach apply", "per-parameter apply", "submitted"), 0)
    stacked, direct, general, submit = plan.stacked_block, plan._apply_direct, plan._apply, graphs.PlanGraphs.submit

    def spy_block(members):
        block = stacked(members)
        seen["block"] += block is not None
        return block

    def spy_direct(*args):
        seen["direct"] += 1
        direct(*args)

    def spy_general(algorithm, group, route, *args):
        seen["foreach apply" if route.apply is not None else "per-parameter apply"] += 1
        general(algorithm, group, route, *args)

    def spy_submit(self, *args):
        seen["submitted"] += 1
        return submit(self, *args)
    for module in (plan, graphs):
        monkeypatch.setattr(module, "stacked_block", spy_block)
    monkeypatch.setattr(plan, "_apply_direct", spy_direct)
    monkeypatch.setattr(plan, "_apply", spy_general)
    monkeypatch.setattr(graphs.PlanGraphs, "submit", spy_submit)
    return seen


def counted_batched(algorithm, calls: list):
    """`algorithm` whose declared direction's batched form notes each call (an undeclared one as it is)."""
    if not isinstance(algorithm.direction, Direction):
        return algorithm
    inner = algorithm.direction.batched

    def batched(grads, states, group):
        calls.append(len(grads))
        return inner(grads, states, group)
    return dataclasses.replace(algorithm, direction=dataclasses.replace(algorithm.direction, batched=batched))


def four_steps(algorithm, observed):
    """(optimizer, parameters, the paths taken over four steps, the shapes captured, the batched calls)."""
    batched: list = []
    opt, ps = make(counted_batched(algorithm, batched), cuda_graphs=True)
    before = dict(observed)
    CAPTURES.clear()
    for step in range(4):
        opt.step()
        regrad(ps, step)
    return opt, ps, {k: observed[k] - before[k] for k in observed}, list(CAPTURES), batched


def test_the_stock_stages_are_records_that_declare_their_forms():
    assert isinstance(MUON.direction, Direction) and MUON.direction.batched is not None
    assert MUON.direction.buffer == "momentum_buffer"
    assert isinstance(MUON.orthogonalize, Orthogonalize) and MUON.orthogonalize.reads_only
    assert MUON.apply is DECOUPLED and isinstance(DECOUPLED, Apply) and DECOUPLED.widens
    assert MUON.select is None and MUON.postprocess is None
    assert DION2.orthogonalize is MUON.orthogonalize and NORMUON.direction is MUON.direction


@pytest.mark.parametrize("algorithm, expected", [
    (MUON, dict(batched=True, block="momentum_buffer", reads_only=True, apply=True, direct=True, graphs=True,
                rehearsed=True)),
    (NORMUON, dict(batched=True, block="momentum_buffer", reads_only=True, apply=True, direct=False, graphs=True,
                   rehearsed=True)),  # a postprocess reads the result: no direct apply
    (DION2, dict(batched=False, block=None, reads_only=False, apply=True, direct=False, graphs=False,
                 rehearsed=False)),  # its select stage reads values: a fresh stack, no graph, no rehearsal
    (dataclasses.replace(MUON, direction=momentum_direction, orthogonalize=orthogonalize_group, apply=decoupled_apply),
     dict(batched=False, block=None, reads_only=False, apply=False, direct=False, graphs=False, rehearsed=True)),
])
def test_the_paths_follow_the_declarations(algorithm, expected):
    """Paths of a group from its stages' declarations (and cuda_graphs): the stock Muon takes every one; the
    same functions given plain declare nothing and take none (negative control)."""
    assert paths_of(algorithm) == expected


def paths_of(algorithm) -> dict:
    """The paths plan.paths gives a 4 x 6 group of `algorithm` with cuda_graphs on."""
    group = Muon([torch.nn.Parameter(torch.zeros(4, 6))], cuda_graphs=True).param_groups[0]
    route = plan.paths(algorithm, group)
    return dict(batched=route.direction is not None, block=route.block, reads_only=route.reads_only,
                apply=route.apply is not None, direct=route.direct, graphs=route.graphs, rehearsed=route.rehearsed)


@pytest.mark.parametrize("stage, bare, lost", [
    ("direction", Direction(momentum_direction), {"batched", "block"}),
    ("orthogonalize", Orthogonalize(orthogonalize_group), {"reads_only", "direct", "graphs"}),
    ("apply", Apply(decoupled_apply), {"direct"}),
])
def test_a_record_of_run_alone_declares_nothing(stage, bare, lost):
    """Every declaration's default is "not declared": a record given only its `run`, in the stock record's place,
    loses exactly the paths that stage's declarations allowed (an orthogonalize not reading-only, an apply that
    does not widen a half-precision update)."""
    stock, got = paths_of(MUON), paths_of(dataclasses.replace(MUON, **{stage: bare}))
    assert {path for path in stock if got[path] != stock[path]} == lost


@pytest.mark.parametrize("record, field", [(MUON.direction, "buffer"), (MUON.orthogonalize, "reads_only"),
                                           (DECOUPLED, "widens")])
def test_the_stage_records_are_frozen(record, field):
    """A stock record is shared (NorMuon's direction is Muon's, Dion2's orthogonalize too): a write to one would
    change every algorithm that holds it."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(record, field, getattr(record, field))


def test_a_step_before_or_after_a_direction_keeps_its_batched_form():
    """before(step): U of step(G), the batched form and the buffer kept; after(step): step(U), the batched form
    kept without sums of squares, and U is no longer the buffer; a direction without a batched form gets none."""
    def run(g, state, group):
        return g + 1

    def batched(gs, states, group):
        return [g + 1 for g in gs], torch.ones(len(gs), 1, dtype=torch.float64)

    stock = Direction(run, batched, buffer="momentum_buffer")
    gs = [torch.full((2, 3), 1.0), torch.zeros(2, 3)]
    before, after = stock.before(double), stock.after(double)
    assert before.buffer == "momentum_buffer" and after.buffer is None
    us, parts = before.batched(gs, [{}, {}], {})
    assert [u[0, 0].item() for u in us] == [before(g, {}, {})[0, 0].item() for g in gs] == [3.0, 1.0]
    assert parts is not None
    us, parts = after.batched(gs, [{}, {}], {})
    assert [u[0, 0].item() for u in us] == [after(g, {}, {})[0, 0].item() for g in gs] == [4.0, 2.0]
    assert parts is None
    bare = Direction(run)
    assert bare.before(double).batched is None and bare.after(double).batched is None


def test_a_step_after_an_apply_follows_each_form_that_applied_and_none_that_declined():
    """after(step): step(x) after the apply, its foreach form and its fused form where that applied (True); a fused
    form that declined (False: nothing done) is not followed by the step, and says so; `fuses` and `widens` kept;
    an apply without those forms gets none (fp64: the projection's 1.2 exactly)."""
    F64 = torch.float64

    def run(x, u, state, group, scale):
        x.sub_(u, alpha=scale)

    def foreach(xs, us, group, scale):
        for x, u in zip(xs, us):
            x.sub_(u, alpha=scale)

    def fused(xs, matrices, group, scale):
        if group["fuse"]:
            foreach(xs, list(matrices), group, scale)
        return group["fuse"]

    def fuses(xs, group):
        return True

    stock = Apply(run, foreach, fuses, fused, widens=True)
    wrapped = stock.after(project)
    assert wrapped.fuses is fuses and wrapped.widens
    x = torch.full((2, 3), 2.0, dtype=F64)
    wrapped(x, torch.full((2, 3), 0.5, dtype=F64), {}, {}, 1.0)
    assert x[0, 0].item() == 1.2
    xs = [torch.full((2, 3), 2.0, dtype=F64), torch.full((2, 3), -2.0, dtype=F64)]
    wrapped.foreach(xs, [torch.zeros(2, 3, dtype=F64), torch.zeros(2, 3, dtype=F64)], {}, 1.0)
    assert [x[0, 0].item() for x in xs] == [1.2, -1.2]
    for fuse, want in ((True, [1.2, 1.2]), (False, [2.0, 3.0])):
        xs = [torch.full((2, 3), 2.0, dtype=F64), torch.full((2, 3), 3.0, dtype=F64)]
        assert wrapped.fused(xs, torch.zeros(2, 2, 3, dtype=F64), {"fuse": fuse}, 1.0) is fuse
        assert [x[0, 0].item() for x in xs] == want
    bare = Apply(run).after(project)
    assert bare.foreach is None and bare.fused is None


LOST = {"direction before": {"batched", "block"}, "orthogonalize before": {"block", "direct", "graph"},
        "apply after": {"direct", "foreach"}}
"""The fast paths the plain form of each WRAPPED composition loses (its other stages stay stock)."""


@pytest.mark.parametrize("name", WRAPPED)
def test_a_wrapped_stock_stage_keeps_every_fast_path_with_the_bits_of_its_plain_form(observed, name):
    """Four steps (the plan's first runs eagerly; its second, with state, captures; then replays) of a wrapped
    stock stage take every fast path: the batched direction (one call a step, over the group), the fresh
    momentum buffers as one block read as the stack, the compute-dtype result applied directly (wide and
    square megabatches; the tall one by the apply's foreach form: a tall result is cast unless fused), every
    megabatch captured in the plan's graph, the step's rehearsal. The same composition as a plain function
    (negative control) loses the paths its plain stage cannot declare, and both step to the same bits."""
    declared, plain = WRAPPED[name]
    opt, ps, seen, captured, batched = four_steps(declared, observed)
    assert batched == [len(SHAPES)] * 4
    assert seen["block"] > 0 and seen["direct"] == 4 * 2 and seen["foreach apply"] == 4
    assert seen["per-parameter apply"] == 0
    assert seen["submitted"] == 4 * 3 and captured == [(3, 6, 10), (2, 10, 6), (2, 4, 3, 2, 2)]
    route = opt._cached.plans[0].paths
    assert route.rehearsed and route.graphs and route.direct and route.reads_only and route.block
    other, qs, slow, slow_captured, slow_batched = four_steps(plain, observed)
    taken = {"batched": bool(slow_batched), "block": slow["block"] > 0, "direct": slow["direct"] > 0,
             "graph": bool(slow_captured), "foreach": slow["per-parameter apply"] == 0}
    assert {path for path, was in taken.items() if not was} == LOST[name]
    for p, q in zip(ps, qs):
        assert torch.equal(p, q), name
        assert torch.equal(opt.state[p]["momentum_buffer"], other.state[q]["momentum_buffer"])


def test_a_step_after_the_orthogonalization_drops_only_the_direct_apply(observed):
    """orthogonalize.after(step): the step would see the result in the compute dtype, not the stack's, so the
    direct apply is not taken; the block, the batched direction and the graph are; the bits are the plain
    composition's."""
    def damp(o, group):
        return o * 0.5

    declared = dataclasses.replace(MUON, orthogonalize=MUON.orthogonalize.after(damp))
    plain = dataclasses.replace(MUON, orthogonalize=lambda m, group: damp(orthogonalize_group(m, group), group))
    opt, ps, seen, captured, batched = four_steps(declared, observed)
    assert seen["direct"] == 0 and seen["block"] > 0 and seen["submitted"] > 0 and captured and batched
    route = opt._cached.plans[0].paths
    assert not route.direct and route.graphs and route.direction is not None
    _, qs, _, plain_captured, _ = four_steps(plain, observed)
    assert not plain_captured
    assert all(torch.equal(p, q) for p, q in zip(ps, qs))


@pytest.mark.parametrize("stage, plain", [("direction", momentum_direction), ("orthogonalize", orthogonalize_group),
                                          ("apply", decoupled_apply)])
def test_a_plain_stock_function_runs_the_general_path_with_the_same_bits(observed, stage, plain):
    """Negative control: the stock function itself, given plain, declares nothing: the executor runs it as
    given (the direction one parameter at a time with no block; the matrix update on a fresh stack, uncaptured,
    cast back; the apply one parameter at a time), and the parameters and buffers are the stock record's, bit
    for bit."""
    stock, ps, fast, fast_captured, fast_batched = four_steps(MUON, observed)
    general, qs, slow, slow_captured, slow_batched = four_steps(dataclasses.replace(MUON, **{stage: plain}), observed)
    assert fast_batched and fast["block"] > 0 and fast["direct"] > 0 and fast_captured
    route = general._cached.plans[0].paths
    if stage == "direction":
        assert route.direction is None and route.block is None and not slow_batched and slow["block"] == 0
    if stage == "orthogonalize":
        assert not route.reads_only and not route.graphs and not slow_captured
        assert slow["submitted"] == slow["block"] == slow["direct"] == 0
    if stage == "apply":
        assert route.apply is None and not route.direct and slow["direct"] == slow["foreach apply"] == 0
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)
        assert torch.equal(stock.state[p]["momentum_buffer"], general.state[q]["momentum_buffer"])


def test_the_rehearsal_takes_a_group_of_wrapped_stages_and_leaves_out_a_value_dependent_select(monkeypatch):
    """plan.rehearse runs the step on meta tensors for groups whose shapes are known before the step (a whole
    select): a group of wrapped stock stages is rehearsed (its stages run on meta tensors), a Dion2 group is
    not; nothing real is written."""
    algorithm = dataclasses.replace(MUON, direction=MUON.direction.before(clip),
                                    orthogonalize=MUON.orthogonalize.before(sparsify), apply=MUON.apply.after(project))
    g = torch.Generator().manual_seed(1)
    ps = [torch.nn.Parameter(torch.randn(6, 10, generator=g)) for _ in range(4)]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)
    opt = Muon([{"params": ps[:2], "algorithm": algorithm}, {"params": ps[2:], "algorithm": "dion2"}])
    before = [p.detach().clone() for p in ps]
    rehearsed = []
    execute = plan.execute
    monkeypatch.setattr(plan, "execute", lambda plans, state, graphs=None: (
        rehearsed.append([(p.algorithm, [q.device.type for q in p.params]) for p in plans]),
        execute(plans, state, graphs))[1])
    plans = plan.make_plan(opt.param_groups, opt.state, None)
    assert plan.rehearse(plans, opt.state) == []  # no Triton kernel here: nothing to note
    assert rehearsed == [[(algorithm, ["meta", "meta"])]]
    assert all(torch.equal(p, q) for p, q in zip(ps, before)) and all(not opt.state[p] for p in ps)


def test_the_selftest_catalogs_stage_replacements_run_the_general_path():
    """harness/apps/selftest_catalog.py breaks a stage by `dataclasses.replace(algorithm, <stage>=broken)`: each
    broken stage is a plain function, which declares nothing, so the executor takes none of the fast paths that
    stage would declare (the selftest's own tests step them: tests/test_selftest*.py)."""
    from harness.apps.selftest_catalog import BY_NAME
    from harness.targets.controls import Control

    group = Muon([torch.nn.Parameter(torch.zeros(4, 6))], cuda_graphs=True).param_groups[0]
    replaced = set()
    for defect in BY_NAME.values():
        control = defect.make()
        if not isinstance(control, Control):
            continue
        broken = control.variant(MUON)
        route = plan.paths(broken, group)
        for stage in ("direction", "select", "orthogonalize", "postprocess", "apply", "lr_scale"):
            if getattr(broken, stage) is getattr(MUON, stage):
                continue
            replaced.add(stage)
            assert not isinstance(getattr(broken, stage), (Direction, Orthogonalize, Apply)), defect.name
            if stage == "direction":
                assert route.direction is None and route.block is None, defect.name
            if stage in ("select", "orthogonalize"):
                assert not route.reads_only and not route.graphs and not route.direct, defect.name
            if stage in ("postprocess", "apply"):
                assert not route.direct, defect.name
    assert {"direction", "orthogonalize", "apply", "lr_scale"} <= replaced, replaced
