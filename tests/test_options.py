"""How a group steps is its own options' choice, as torch.optim's `fused` is (optimizers/kernels.py,
optimizers/groups.py), never a process global: the options' defaults and checks, a changed option validated
before any write and compiled ahead as a fresh plan, the CPU step's bits under the default, the counters on the
optimizer (`stats`), and the module-level state left in optimizers/ (benchmarks/module_state.py)."""

from __future__ import annotations

import os
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # before triton's import (module_state imports every module), which reads it
    os.environ.setdefault("TRITON_INTERPRET", "1")

from optimizers import Muon, kernels, launches, plan  # noqa: E402
from optimizers import gram_newton_schulz as gram  # noqa: E402
from optimizers.kernels import TORCH, Kernels  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import module_state  # noqa: E402

SHAPES = ((6, 10), (6, 10), (10, 6), (4, 3, 2, 2))


def make(seed=0, **options):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in SHAPES]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)
    return Muon(ps, lr=0.1, flatten=True, **options), ps


def snapshot(opt, ps):
    return ([p.detach().clone() for p in ps], [p.grad.clone() for p in ps],
            {i: {k: v.clone() for k, v in opt.state[p].items()} for i, p in enumerate(ps)},
            [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups])


def same(a, b):
    (pa, ga, sa, oa), (pb, gb, sb, ob) = a, b
    return (all(torch.equal(x, y) for x, y in zip(pa, pb)) and all(torch.equal(x, y) for x, y in zip(ga, gb))
            and sa.keys() == sb.keys() and all(sa[i].keys() == sb[i].keys() and all(
                torch.equal(sa[i][k], sb[i][k]) for k in sa[i]) for i in sa) and oa == ob)


def test_the_options_default_as_torch_optims_and_are_per_group():
    opt, ps = make()
    assert opt.param_groups[0]["fused"] is None and opt.param_groups[0]["cuda_graphs"] is None
    opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, 3))], "fused": False, "cuda_graphs": True})
    assert (opt.param_groups[1]["fused"], opt.param_groups[1]["cuda_graphs"]) == (False, True)
    saved = opt.state_dict()["param_groups"]
    assert [(g["fused"], g["cuda_graphs"]) for g in saved] == [(None, None), (False, True)]


@pytest.mark.parametrize("fused", ["yes", 1, 0.0])
def test_fused_must_be_none_or_a_bool(fused):
    with pytest.raises(TypeError, match=r"param group 0: fused must be None, True or False"):
        make(fused=fused)


def test_fused_true_is_refused_where_the_kernels_cannot_run(monkeypatch):
    """fused=True demands the kernels: without triton, or with a parameter they do not reach (a CPU without
    Triton's interpreter), the optimizer is refused at construction, naming why; fused=None is not."""
    monkeypatch.setattr(kernels, "available", lambda: False)
    with pytest.raises(ValueError, match=r"param group 0: fused=True .* triton cannot be imported"):
        make(fused=True)
    make(fused=None)
    monkeypatch.setattr(kernels, "available", lambda: True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=r"param group 0: fused=True .* parameter 0 is on cpu"):
        make(fused=True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    make(fused=True)  # the interpreter runs the kernels on CPU


def test_the_kernels_a_call_takes(monkeypatch):
    """kernels.of: none with fused=False, none on a CPU with fused=None (the interpreter is never faster), the
    sized ones on CUDA with fused=None (a meta tensor standing in for a CUDA one in a rehearsal too), every size
    with fused=True where they reach; none at all without triton."""
    monkeypatch.setattr(kernels, "available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cpu, meta = torch.zeros(2), torch.zeros(2, device="meta")
    assert kernels.of(False, cpu) == TORCH and kernels.of(None, cpu) == TORCH
    assert kernels.of(True, cpu) == Kernels(on=True, sized=False)
    with launches.recording(torch.device("cuda")):
        assert kernels.of(None, meta) == Kernels(on=True) and kernels.of(False, meta) == TORCH
    with launches.recording(torch.device("cpu")):
        assert kernels.of(None, meta) == TORCH
    assert kernels.of(None, meta) == TORCH  # a meta tensor outside a rehearsal stands for nothing
    monkeypatch.setattr(kernels, "available", lambda: False)
    assert kernels.of(True, cpu) == TORCH


def test_a_call_in_a_graph_takes_the_graphed_sizes(monkeypatch):
    """kernels.in_graph: the calls it wraps take Kernels(graphed=True) under fused=None (a rehearsal's meta tensor
    on CUDA stands in), and only they: the flag is reset after the call, an exception's too."""
    monkeypatch.setattr(kernels, "available", lambda: True)
    meta = torch.zeros(2, device="meta")
    with launches.recording(torch.device("cuda")):
        assert kernels.in_graph(kernels.of)(None, meta) == Kernels(on=True, graphed=True)
        assert kernels.of(None, meta) == Kernels(on=True)
        assert kernels.in_graph(kernels.of)(True, meta) == Kernels(on=True, sized=False)

        def fails():
            raise RuntimeError("inside")
        with pytest.raises(RuntimeError, match="inside"):
            kernels.in_graph(fails)()
        assert kernels.of(None, meta) == Kernels(on=True)


def test_a_product_in_a_graph_takes_the_kernel_from_graphed_rows(monkeypatch):
    """symmetric: a sized product takes the kernel from TRITON_ROWS rows, from GRAPHED_ROWS in a graph; an unsized
    one (fused=True) at any size; none where the kernels are off. Negative control: GRAPHED_ROWS - 1 rows never."""
    from optimizers import symmetric
    fake = types.SimpleNamespace(usable=lambda a: True)
    monkeypatch.setattr(symmetric, "triton_kernel", lambda: fake)
    assert symmetric.GRAPHED_ROWS < symmetric.TRITON_ROWS

    def takes(rows, chosen):
        return symmetric._kernel_for(torch.empty(1, rows, 2, device="meta"), chosen) is fake
    graphed = Kernels(on=True, graphed=True)
    assert not takes(symmetric.GRAPHED_ROWS - 1, graphed) and takes(symmetric.GRAPHED_ROWS, graphed)
    assert not takes(symmetric.TRITON_ROWS - 1, Kernels(on=True)) and takes(symmetric.TRITON_ROWS, Kernels(on=True))
    assert takes(1, Kernels(on=True, sized=False)) and not takes(symmetric.TRITON_ROWS, TORCH)
    assert takes(4096, Kernels(on=True)) and takes(768, graphed)  # above a threshold too, not only at it


def test_the_measured_thresholds_are_the_documented_ones():
    """The sizes from which the default splits products into blocks (2048 rows, at most 4 blocks) and takes the
    kernel (2048 rows; 256 in a graph): measured choices that the docs quote (docs/gpu-speed.md; performance.md
    sections 14 and 15), so a changed one is a failing test and a CHANGELOG entry, as a changed default is."""
    from optimizers import symmetric
    assert [symmetric.blocks(m) for m in (2047, 2048, 3071, 3072, 4096, 8192)] == [1, 2, 2, 3, 4, 4]
    assert (symmetric.TRITON_ROWS, symmetric.GRAPHED_ROWS) == (2048, 256)


@pytest.mark.parametrize("cuda_graphs, max_numel, graphed", [(None, None, True), (True, 10, True),
                                                             (None, 10, False), (False, None, False)])
def test_a_megabatch_the_plans_graph_captures_steps_in_graph(monkeypatch, cuda_graphs, max_numel, graphed):
    """plan.execute runs the orthogonalization of each megabatch the plan's graph would capture (cuda_graphs not
    False, the stack within graphs.MAX_NUMEL or cuda_graphs=True) under kernels.in_graph, in its eager steps too,
    so that they and the graph's replays take the same kernels; the rest outside it."""
    from optimizers import graphs
    if max_numel is not None:
        monkeypatch.setattr(graphs, "MAX_NUMEL", max_numel)
    seen = []
    real = kernels.of

    def spied(fused, t):
        seen.append(kernels._GRAPHED.get())
        return real(fused, t)
    monkeypatch.setattr(kernels, "of", spied)
    opt, _ = make(cuda_graphs=cuda_graphs)
    opt.step()
    assert seen and any(seen) == graphed, seen


def test_the_graphs_limit_is_on_the_stacks_elements(monkeypatch):
    """Under cuda_graphs=None a megabatch steps in graph only if its stack (members x matrix elements) is within
    graphs.MAX_NUMEL: with a limit of 100, SHAPES' stack of two 6 x 10 matrices (120 elements) steps outside it,
    the 60- and 48-element stacks inside."""
    from optimizers import graphs
    monkeypatch.setattr(graphs, "MAX_NUMEL", 100)
    wrapped = []
    real = kernels.in_graph

    def spied(update):
        inner = real(update)

        def run(stack, *args, **kwargs):
            wrapped.append(tuple(stack.shape))
            return inner(stack, *args, **kwargs)
        return run
    monkeypatch.setattr(kernels, "in_graph", spied)
    opt, _ = make()
    opt.step()
    assert wrapped == [(1, 10, 6), (1, 4, 3, 2, 2)]


def test_the_default_cpu_step_is_the_torch_step_bit_for_bit(monkeypatch):
    """With no option set, a CPU step takes no kernel, even where triton and its interpreter are there: the
    parameters step to fused=False's bits."""
    monkeypatch.setattr(kernels, "available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for orthogonalizer in ("polar_express", "gram_newton_schulz"):
        default, ps = make(orthogonalizer=orthogonalizer, compute_dtype=torch.bfloat16)
        torch_step, qs = make(orthogonalizer=orthogonalizer, compute_dtype=torch.bfloat16, fused=False)
        for _ in range(3):
            default.step()
            torch_step.step()
        assert all(torch.equal(p, q) for p, q in zip(ps, qs))
        assert default.stats.products == 0


def test_a_changed_option_is_validated_before_any_write(monkeypatch):
    """Switching fused to True between steps where the kernels cannot run: the step raises, naming it, with no
    parameter, gradient, state entry or option touched; switched back, the optimizer steps on as one that never
    switched."""
    monkeypatch.setattr(kernels, "available", lambda: False)
    opt, ps = make()
    reference, qs = make()
    opt.step()
    reference.step()
    opt.param_groups[0]["fused"] = True
    before = snapshot(opt, ps)
    with pytest.raises(ValueError, match="fused=True"):
        opt.step()
    assert same(snapshot(opt, ps), before)
    opt.param_groups[0]["cuda_graphs"] = "yes"
    opt.param_groups[0]["fused"] = None
    before = snapshot(opt, ps)
    with pytest.raises(TypeError, match="cuda_graphs must be None, True or False"):
        opt.step()
    assert same(snapshot(opt, ps), before)
    opt.param_groups[0]["cuda_graphs"] = False
    opt.step()
    reference.step()
    assert all(torch.equal(p, q) for p, q in zip(ps, qs))


def test_a_changed_option_is_compiled_ahead_as_a_fresh_plan(monkeypatch):
    """The plan cache keys on the options: a changed `fused` or `cuda_graphs` makes a fresh plan, which
    compile_ahead sees with the new option (the first two steps plan anew: the state is created between them)."""
    seen = []
    monkeypatch.setattr(plan, "compile_ahead",
                        lambda plans, state: seen.append([(p.group["fused"], p.group["cuda_graphs"]) for p in plans]))
    opt, ps = make(fused=False)
    for _ in range(3):
        opt.step()
    assert seen == [[(False, None)]] * 2
    opt.param_groups[0]["fused"] = None
    opt.step()
    opt.step()
    opt.param_groups[0]["cuda_graphs"] = True
    opt.step()
    assert seen == [[(False, None)]] * 2 + [[(None, None)], [(None, True)]]


def test_compile_ahead_compiles_where_a_groups_fused_option_takes_a_kernel(monkeypatch):
    """compile_ahead's decision reads each group's option (the kernels of kernels.of on the megabatches' CUDA
    device): it compiles a plan whose group takes the kernels, and not one whose group says fused=False."""
    monkeypatch.setattr(kernels, "available", lambda: True)
    compiled = []
    monkeypatch.setattr(plan, "compile_for", lambda plans, state, device: compiled.append(device) or 1)
    on_cuda = types.SimpleNamespace(device=torch.device("cuda", 0), is_meta=False)

    def plans(fused):
        return [plan.GroupPlan({"fused": fused}, None, (on_cuda,), (plan.Megabatch((4, 4), (on_cuda,), None),))]
    assert plan.compile_ahead(plans(None), {}) == 1 and plan.compile_ahead(plans(True), {}) == 1
    assert plan.compile_ahead(plans(False), {}) == 0
    assert compiled == [torch.device("cuda", 0)] * 2


def test_stats_belong_to_each_optimizer_and_a_fallback_warns_once(monkeypatch):
    """Two optimizers count their own Gram matrices; with every Gram result diverging (DIVERGED at 0), each
    counts its fallbacks and warns at its first only."""
    first, ps = make(orthogonalizer="gram_newton_schulz")
    second, qs = make(orthogonalizer="gram_newton_schulz")
    first.step()
    assert first.stats.gram == 4 and second.stats.gram == 0 and first.stats.fallbacks == 0  # every member wide or tall
    monkeypatch.setattr(gram, "DIVERGED", 0.0)
    with pytest.warns(RuntimeWarning, match="diverged") as caught:
        second.step()
    assert len(caught) == 1 and second.stats.fallbacks == 4 and second.stats.gram == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second.step()
    assert second.stats.fallbacks == 8 and first.stats.fallbacks == 0


def test_the_module_state_of_optimizers_is_the_documented_memoization_and_compile_record():
    """No module of optimizers/ keeps a switch or a counter: its module-level mutable objects are import and
    table memoization, the process's record of its Triton compiles and a device's scratch counts (each
    documented where it is defined);
    a new one fails this test. Negative control: the counter sees a planted dict."""
    expected = {"optimizers.optional": {"LOADED"}, "optimizers.launches": {"COMPILED", "FAILURES", "BACKGROUND"},
                "optimizers.symmetric_triton": {"_PAIRS", "WARMING", "BROKEN"},
                "optimizers.elementwise_triton": {"_TABLES", "_ARRIVALS"}}
    found = {}
    for module in module_state.modules("optimizers"):
        names = [n for n in module_state.own_names(module) if hasattr(module, n) and not n.startswith("__")
                 and module_state.mutable(getattr(module, n))]
        if names:
            found[module.__name__] = set(names)
    assert found == {k: v for k, v in expected.items() if k in sys.modules}, found
    planted = types.ModuleType("planted")
    planted.SWITCH = {}
    assert module_state.mutable(planted.SWITCH) and not module_state.mutable(types.MappingProxyType({}))
