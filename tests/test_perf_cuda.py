"""The fast paths on CUDA (skipped without CUDA): CUDA graphs of small megabatches; symmetric products by
blocks (from 2048 rows) and Gram Newton-Schulz, in bf16/fp16, no farther from the fp64 iteration
than the plain products are."""

import pytest
import torch

from optimizers import symmetric
from optimizers.orthogonalize import orthogonalize

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def gaussian(*shape, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float64)


def plain(fn):
    saved, symmetric.BLOCK = symmetric.BLOCK, 1 << 62
    try:
        return fn()
    finally:
        symmetric.BLOCK = saved


def rel(x, ref):
    return float((x.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("m, n", [(2048, 4096), (4096, 4096)])
def test_blocked_gram_matrix_in_bf16(m, n):
    x = gaussian(1, m, n).bfloat16()
    exact = x.double() @ x.double().mT
    assert symmetric.blocks(m) >= 2
    blocked, full = symmetric.symmetric_bmm(x, x.mT), x @ x.mT
    assert rel(blocked, exact) <= 1.5 * rel(full, exact)


@pytest.mark.parametrize("name, compute, shape", [
    ("polar_express", torch.bfloat16, (4096, 4096)),
    ("newton_schulz", torch.bfloat16, (2048, 6144)),
    ("gram_newton_schulz", torch.bfloat16, (2048, 6144)),
    ("gram_newton_schulz", torch.float16, (4096, 11008)),
])
def test_fast_orthogonalizers_match_the_plain_ones(name, compute, shape):
    """Each orthogonalizer with symmetric products by blocks: error against the same iteration in fp64 with
    plain products at most 1.5 times that of the same compute dtype with plain products."""
    g = gaussian(1, *shape, seed=1)
    exact = plain(lambda: orthogonalize(g, name, 5, 1e-7, torch.float64))
    fast = orthogonalize(g.float(), name, 5, 1e-7, compute)
    slow = plain(lambda: orthogonalize(g.float(), name, 5, 1e-7, compute))
    assert rel(fast, exact) <= 1.5 * rel(slow, exact), (rel(fast, exact), rel(slow, exact))
    assert rel(fast, exact) < 0.1


def small_set(seed=0):
    """GPT-2-like megabatches at a quarter of the width, fp32 parameters and gradients on CUDA."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shapes = [(576, 192), (192, 192), (768, 192), (192, 768)] * 3 + [(64, 16, 2, 2)]
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen, device="cuda")) for s in shapes]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen, device="cuda")
    return ps


@pytest.mark.parametrize("orthogonalizer", ["polar_express", "newton_schulz", "gram_newton_schulz"])
def test_cuda_graphs_give_the_eager_bits(orthogonalizer):
    """Muon(cuda_graphs=True) replays the eager kernels: every parameter equal bit for bit to the eager
    optimizer's over 6 steps (gradients redrawn each step), the same Gram Newton-Schulz counts; every
    megabatch captured in the plan's one graph (its megabatches on parallel streams) at the plan's second
    step and replayed after."""
    from optimizers import Muon

    ps, qs = small_set(), small_set()
    fast = Muon(ps, flatten=True, orthogonalizer=orthogonalizer, cuda_graphs=True)
    eager = Muon(qs, flatten=True, orthogonalizer=orthogonalizer, cuda_graphs=False)
    for step in range(6):
        for opt in (fast, eager):
            opt.step()
        gen = torch.Generator(device="cuda").manual_seed(100 + step)
        for p, q in zip(ps, qs):
            p.grad = torch.randn(p.shape, generator=gen, device="cuda")
            q.grad = p.grad.clone()
    torch.cuda.synchronize()
    assert all(torch.equal(p, q) for p, q in zip(ps, qs))
    plan_graphs = fast._cached.graphs
    assert plan_graphs.failures == []
    assert len(plan_graphs.members) == 5 and None not in plan_graphs.members.values(), plan_graphs.members
    assert plan_graphs.replays == 4
    assert (fast.stats.gram, fast.stats.fallbacks) == (eager.stats.gram, eager.stats.fallbacks), (fast.stats,
                                                                                                  eager.stats)


def test_the_default_captures_small_sets_and_a_step_captured_whole_replays_the_eager_bits():
    """The default (cuda_graphs=None) captures the small set's megabatches, as True does; and a training step
    captured whole by the caller, as torch's CUDA-graph notes show (warm-up on a side stream, then opt.step()
    captured with static gradients, each replay after new gradients are copied in), records the step eagerly
    into the caller's graph: after 3 replays every parameter equals the eager optimizer's bit for bit."""
    from optimizers import Muon

    ps, qs = small_set(), small_set()
    opt = Muon(ps, flatten=True)
    eager = Muon(qs, flatten=True, cuda_graphs=False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # state, a fresh plan, its capture
            opt.step()
            eager.step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    own = opt._cached.graphs
    assert own.graph is not None and len(own.members) == 5 and None not in own.members.values(), own.members
    whole = torch.cuda.CUDAGraph()
    with torch.cuda.graph(whole):
        opt.step()
    for step in range(3):
        gen = torch.Generator(device="cuda").manual_seed(200 + step)
        for p, q in zip(ps, qs):
            p.grad.copy_(torch.randn(p.shape, generator=gen, device="cuda"))
            q.grad = p.grad.clone()
        whole.replay()
        eager.step()
    torch.cuda.synchronize()
    assert all(torch.equal(p, q) for p, q in zip(ps, qs))
    assert opt._cached.graphs is own and own.failures == [] and opt.stats.capture_failures == 0


def test_cuda_graphs_cut_the_launches():
    """Kernel launches of one step (torch.profiler's cudaLaunchKernel / cudaGraphLaunch calls): with
    graphs at most half of eager's (counted on CPU: 39 of the step's ops are per parameter, ~110 are
    the 5 megabatches' orthogonalizations, which become one graph launch)."""
    from torch.profiler import ProfilerActivity, profile

    from optimizers import Muon

    counts = {}
    for flag in (False, True):
        opt = Muon(small_set(), flatten=True, cuda_graphs=flag)
        for _ in range(4):
            opt.step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            opt.step()
            torch.cuda.synchronize()
        counts[flag] = sum(1 for e in prof.events() if e.name in ("cudaLaunchKernel", "cudaLaunchKernelExC",
                                                                  "cuLaunchKernel", "cuLaunchKernelEx",
                                                                  "cudaGraphLaunch"))
    print(f"launches per step: eager {counts[False]}, graphs {counts[True]}")
    assert 0 < counts[True] <= counts[False] / 2, counts


def test_compile_ahead_leaves_the_first_step_nothing_to_compile(monkeypatch):
    """With the kernels of fused=None (the default, triton installed), a new plan's Triton kernels are compiled
    side by side before its step (optimizers/plan.py compile_ahead): the step itself then adds no kernel to any
    of the kernels' in-process caches (emptied first, so that the compiles are this test's; Triton's disk cache
    may serve them). The default persistent kernel compiles in the background meanwhile (tma stands in); once
    it is done, the next plan's step runs it and compiles nothing either."""
    pytest.importorskip("triton")
    from optimizers import Muon, elementwise_triton, launches, plan, symmetric_triton

    kernels = [symmetric_triton._upper_tiles_tma, symmetric_triton._upper_tiles, elementwise_triton._momentum,
               elementwise_triton._apply, elementwise_triton._divide]
    persistent = symmetric_triton._upper_tiles_persistent
    if not all(hasattr(k, "device_caches") for k in kernels + [persistent]):
        pytest.skip("this triton keeps its compiled kernels elsewhere")

    def compiled(of=kernels):
        return sum(len(caches[0]) for k in of for caches in k.device_caches.values())

    for k in kernels + [persistent]:
        k.device_caches.clear()
    monkeypatch.setattr(symmetric_triton, "WARMING", set())
    monkeypatch.setattr(launches, "COMPILED", set())
    assert symmetric_triton.slow_default() == "persistent"
    ahead, original = [], plan.compile_ahead

    def counted(plans, state):
        ahead.append((original(plans, state), compiled()))
        return ahead[-1][0]
    monkeypatch.setattr(plan, "compile_ahead", counted)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen, device="cuda")) for s in [(2048, 4096)] * 2 + [(4096, 2048)]]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen, device="cuda")
    opt = Muon(ps, orthogonalizer="gram_newton_schulz", weight_decay=0.1)
    opt.step()
    torch.cuda.synchronize()
    assert launches.FAILURES == []
    assert len(ahead) == 1 and ahead[0][0] >= 4, ahead  # products (2), divide, momentum, apply
    assert compiled() == ahead[0][1], (compiled(), ahead)
    launches.wait()
    warm = compiled([persistent])
    assert launches.FAILURES == [] and warm >= 2 and symmetric_triton.WARMING == set(), warm
    before = dict(opt.stats.variants)
    opt.step()  # a new plan (the state entries exist now): compiled ahead, the persistent kernel runs
    torch.cuda.synchronize()
    assert len(ahead) == 2 and compiled([persistent]) == warm
    assert opt.stats.variants.get("persistent", 0) > before.get("persistent", 0)
