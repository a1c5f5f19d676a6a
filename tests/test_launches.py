"""Compiling a step's Triton kernels ahead (optimizers/launches.py; optimizers/plan.py `rehearse`,
`compile_ahead`): the step rehearsed on meta tensors notes the same kernel specializations as the step
itself launches, on every path that reaches a kernel, at the first step and at a later plan; the rehearsal
reads and writes nothing real; a failed compile-ahead warns and leaves the step as it was. The rehearsal
tests run the kernels under Triton's CPU interpreter (skipped without triton); the compiles themselves are
tested on CUDA (tests/test_perf_cuda.py)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

if not torch.cuda.is_available():  # before triton's import, which reads it (this process has no GPU to leak to)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import optimizers  # noqa: E402
from optimizers import launches, plan  # noqa: E402
from optimizers.counters import Stats, counting  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class FakeKernel:
    """A kernel[grid](*args) stand-in counting its runs."""

    def __init__(self):
        self.runs = []

    def __getitem__(self, grid):
        return lambda *args, **options: self.runs.append((grid, args, options))


def test_launch_runs_outside_recording_and_only_notes_within():
    kernel = FakeKernel()
    launches.launch(kernel, (2, 1), 1.0, BLOCK=8)
    assert kernel.runs == [((2, 1), (1.0,), {"BLOCK": 8})]
    with launches.recording() as noted:
        launches.launch(kernel, (3,), 5, BLOCK=4)
    assert len(kernel.runs) == 1
    assert noted == [launches.Launch(kernel, (3,), (5,), {"BLOCK": 4})]
    launches.launch(kernel, (1,))
    assert len(kernel.runs) == 2


def test_meta_tensors_stand_in_for_cuda_only_while_recording():
    meta = torch.empty(4, device="meta")
    assert not launches.on_device(meta) and not launches.on_device(torch.empty(4))
    with launches.recording():
        assert launches.on_device(meta) and not launches.on_device(torch.empty(4))
    assert not launches.on_device(meta)


def test_distinct_merges_exactly_what_triton_compiles_once():
    """Launches differing only where Triton does not specialize (grid, float values, int values of the same
    class, tensor shapes) merge; a dtype, an alignment, an int of another class, an option apart."""
    k, other = FakeKernel(), FakeKernel()
    storage = torch.empty(64, dtype=torch.float16, device="meta")
    aligned, offset = storage[:32], storage[1:33]
    base = launches.Launch(k, (1,), (aligned, 4096, 0.5), {"TILE": 128})
    same = [launches.Launch(k, (7, 2), (storage[8:40], 11008, 2.0), {"TILE": 128})]
    apart = [launches.Launch(other, (1,), (aligned, 4096, 0.5), {"TILE": 128}),
             launches.Launch(k, (1,), (aligned.float(), 4096, 0.5), {"TILE": 128}),
             launches.Launch(k, (1,), (offset, 4096, 0.5), {"TILE": 128}),
             launches.Launch(k, (1,), (aligned, 4100, 0.5), {"TILE": 128}),
             launches.Launch(k, (1,), (aligned, 1, 0.5), {"TILE": 128}),
             launches.Launch(k, (1,), (aligned, 4096, 0.5), {"TILE": 64})]
    assert launches.distinct([base] + same) == [base]
    assert launches.distinct([base] + apart) == [base] + apart


SHAPES = [(24, 40), (24, 40), (40, 24), (40, 24), (24, 24), (8, 4, 3, 3), (8, 4, 3, 3), (16, 8, 3)]
"""Wide, tall and square megabatches, convolutions (flattened or sliced) and a 3-D weight."""

CONFIGS = [
    dict(orthogonalizer="gram_newton_schulz", compute_dtype=torch.float16, weight_decay=0.1, flatten=True),
    dict(orthogonalizer="gram_newton_schulz", compute_dtype=torch.bfloat16, nesterov=True),
    dict(orthogonalizer="polar_express", compute_dtype=torch.bfloat16, weight_decay=0.1),
    dict(orthogonalizer="newton_schulz", compute_dtype=torch.float16, flatten=True, nesterov=True),
    dict(algorithm="normuon", compute_dtype=torch.bfloat16, weight_decay=0.1),
    dict(orthogonalizer="gram_newton_schulz", weight_decay=0.1),  # the device's default compute dtype
]


@pytest.fixture
def kernels_on(monkeypatch):
    """The kernels' modules (triton installed), the real launches spied on; the optimizers of these tests ask
    for fused=True (`setup`): the kernels at every size, the tests' small ones too."""
    pytest.importorskip("triton")
    from optimizers import elementwise_triton, symmetric_triton
    real: list[launches.Launch] = []

    def spy(kernel, grid, *args, **options):
        if not launches.noting():
            real.append(launches.Launch(kernel, tuple(grid), args, options))
        launches.launch(kernel, grid, *args, **options)
    for module in (symmetric_triton, elementwise_triton):
        monkeypatch.setattr(module, "launch", spy)
    return real


def specializations(noted):
    return {launches.specialization(item) for item in noted}


def setup(config, seed=0, fused=True):
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s, generator=g).to(DEVICE)) for s in SHAPES]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(DEVICE)
    return params, optimizers.Muon(params, lr=0.02, fused=fused, **config)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_rehearsal_notes_the_kernels_the_step_launches(kernels_on, config, monkeypatch):
    """At the first plan (no state yet) and at the second (momentum buffers held): the same launches, in
    number and in specialization, elementwise kernels among them. (No background compile here: while one
    runs, the step launches the stand-in variant, and so does compile_for's own rehearsal; on CUDA the
    step's compile_ahead would start one.)"""
    from optimizers import symmetric_triton
    monkeypatch.setattr(symmetric_triton, "STAND_INS", {})
    params, opt = setup(config)
    for step in range(2):
        plans = plan.make_plan(opt.param_groups, opt.state, None)
        rehearsed = plan.rehearse(plans, opt.state)
        kernels_on.clear()
        opt.step()
        assert len(rehearsed) == len(kernels_on) > 0, f"step {step}"
        assert specializations(rehearsed) == specializations(kernels_on), f"step {step}"
        names = {item.kernel.fn.__name__ if hasattr(item.kernel, "fn") else str(item.kernel) for item in rehearsed}
        assert {"_momentum", "_apply"} <= names, names
        for p in params:
            p.grad = torch.randn_like(p)


def test_rehearsal_leaves_out_groups_that_select_rows_by_value(kernels_on):
    """Dion2's row selection depends on the values (its shapes are unknown on meta tensors): its group is left
    out of the rehearsal, the Muon group beside it is not."""
    params, opt = setup(CONFIGS[2])
    g = torch.Generator().manual_seed(1)
    dion = [torch.nn.Parameter(torch.randn(24, 40, generator=g).to(DEVICE)) for _ in range(2)]
    for p in dion:
        p.grad = torch.randn(p.shape, generator=g).to(DEVICE)
    opt.add_param_group({"params": dion, "algorithm": "dion2"})
    plans = plan.make_plan(opt.param_groups, opt.state, None)
    noted = plan.rehearse(plans, opt.state)
    alone = plan.rehearse(plans[:1], opt.state)
    assert noted and specializations(noted) == specializations(alone) and len(noted) == len(alone)


def test_a_group_left_out_does_not_end_the_rehearsal_which_stands_in_for_the_first_rehearsed_device(monkeypatch):
    """A Dion2 group left out before a Muon group of one parameter: the Muon group is rehearsed still, on the device
    of its parameter (a `continue` made `break` rehearsed nothing, on no device; `params[1]` of its megabatch of
    one raised). With the kernels, its launches are those of the Muon group alone."""
    g = torch.Generator().manual_seed(2)
    dion = [torch.nn.Parameter(torch.randn(24, 40, generator=g).to(DEVICE)) for _ in range(2)]
    muon = [torch.nn.Parameter(torch.randn(24, 24, generator=g).to(DEVICE))]
    for p in dion + muon:
        p.grad = torch.randn(p.shape, generator=g).to(DEVICE)
    fused = True if importlib.util.find_spec("triton") else None  # the kernels where triton is, else none
    opt = optimizers.Muon([{"params": dion, "algorithm": "dion2"}, {"params": muon}], lr=0.02, fused=fused)
    devices, real = [], launches.recording
    monkeypatch.setattr(launches, "recording", lambda device=None: devices.append(device) or real(device))
    plans = plan.make_plan(opt.param_groups, opt.state, None)
    both, alone = plan.rehearse(plans, opt.state), plan.rehearse(plans[1:], opt.state)
    assert devices == [muon[0].device] * 2 and len(both) == len(alone)
    assert specializations(both) == specializations(alone)


def test_rehearsal_reads_and_writes_nothing_real(kernels_on):
    params, opt = setup(CONFIGS[0])
    opt.step()  # state held
    before = [(p.detach().clone(), p.grad.clone()) for p in params]
    state = {p: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in opt.state[p].items()} for p in params}
    plans = plan.make_plan(opt.param_groups, opt.state, None)
    kernels_on.clear()
    from optimizers import elementwise_triton
    tables = list(elementwise_triton._TABLES)
    with counting(Stats()) as stats:
        assert plan.rehearse(plans, opt.state)
    assert kernels_on == []  # nothing launched
    assert stats == Stats() and list(elementwise_triton._TABLES) == tables  # nothing counted, nothing cached
    for p, (value, grad) in zip(params, before):
        assert torch.equal(p, value) and torch.equal(p.grad, grad)
        assert opt.state[p].keys() == state[p].keys()
        assert all(torch.equal(v, state[p][k]) for k, v in opt.state[p].items() if isinstance(v, torch.Tensor))
    assert len(opt.state) == len(params)


def test_compile_ahead_compiles_nothing_off_cuda_or_with_the_kernels_off(kernels_on, monkeypatch):
    monkeypatch.setattr(launches, "compile_all", lambda noted, device: pytest.fail("compiled"))
    params, opt = setup(CONFIGS[0])
    plans = plan.make_plan(opt.param_groups, opt.state, None)
    if DEVICE == "cpu":
        assert plan.compile_ahead(plans, opt.state) == 0
    opt.param_groups[0]["fused"] = False
    assert plan.compile_ahead(plan.make_plan(opt.param_groups, opt.state, None), opt.state) == 0


def test_a_failed_compile_ahead_warns_and_the_step_runs_as_before(monkeypatch):
    """compile_ahead runs once per new plan; its failure is a warning, and the parameters step as without it."""
    calls = []

    def broken(plans, state):
        calls.append(len(plans))
        raise RuntimeError("no compiler")
    params, opt = setup(CONFIGS[2], fused=None)
    reference, ref_opt = setup(CONFIGS[2], fused=None)
    ref_opt.step()
    monkeypatch.setattr(plan, "compile_ahead", broken)
    with pytest.warns(RuntimeWarning, match="compiling the step's Triton kernels ahead failed .*no compiler"):
        opt.step()
    assert calls == [1]
    for p, q in zip(params, reference):
        assert torch.equal(p, q)


def kernel_names(noted):
    return {item.kernel.fn.__name__ if hasattr(item.kernel, "fn") else str(item.kernel) for item in noted}


def test_a_slow_default_variant_compiles_in_the_background_while_its_stand_in_runs(kernels_on, monkeypatch):
    """compile_for: a plan that launches persistent kernels (STAND_INS) not compiled yet compiles the step's
    launches with tma in their place now, and the persistent launches in the background; until that ends the
    default resolves to tma (the same bits: tests/test_symmetric_triton.py), then to persistent, and a plan made
    meanwhile compiles ahead with tma, leaving the background compile's variant warming. A later plan
    whose launches are all compiled compiles ahead as usual, from one rehearsal; one with no symmetric product
    starts no background compile."""
    from optimizers import symmetric_triton
    monkeypatch.setattr(symmetric_triton, "WARMING", set())
    monkeypatch.setattr(launches, "COMPILED", set())
    now, later, finish = [], [], []

    def compile_all(noted, device):
        now.append(noted)
        launches.COMPILED.update(launches.specialization(item) for item in noted)
        return len(launches.distinct(noted))

    def background(noted, device, done):
        later.append(noted)
        finish.append(lambda: (launches.COMPILED.update(launches.specialization(i) for i in noted), done()))
    monkeypatch.setattr(launches, "compile_all", compile_all)
    monkeypatch.setattr(launches, "compile_in_background", background)
    params, opt = setup(dict(orthogonalizer="gram_newton_schulz", compute_dtype=torch.float16))
    x = torch.randn(2, 32, 48, dtype=torch.float16, device=DEVICE)
    plans = plan.make_plan(opt.param_groups, opt.state, None)
    assert plan.compile_for(plans, opt.state, torch.device(DEVICE)) == len(launches.distinct(now[0]))
    assert "_upper_tiles_tma" in kernel_names(now[0]) and "_upper_tiles_persistent" not in kernel_names(now[0])
    assert kernel_names(later[0]) == {"_upper_tiles_persistent"}
    assert symmetric_triton.WARMING == {"persistent"} and symmetric_triton.resolve(None, None, x, x.mT) == "tma"
    opt.step()  # while warming: the stand-in runs
    assert "_upper_tiles_tma" in kernel_names(kernels_on) and "_upper_tiles_persistent" not in kernel_names(kernels_on)
    launches.COMPILED.clear()  # a plan made while warming, with launches not compiled yet: the stand-in's
    plan.compile_for(plan.make_plan(opt.param_groups, opt.state, None), opt.state, torch.device(DEVICE))
    assert len(later) == 1 and symmetric_triton.WARMING == {"persistent"}
    assert "_upper_tiles_persistent" not in kernel_names(now[-1])
    finish[0]()
    assert symmetric_triton.WARMING == set() and symmetric_triton.resolve(None, None, x, x.mT) == "persistent"
    plans = plan.make_plan(opt.param_groups, opt.state, None)  # a new plan: the state entries exist now
    rehearsals, rehearse = [], plan.rehearse
    monkeypatch.setattr(plan, "rehearse", lambda *a: rehearsals.append(1) or rehearse(*a))
    plan.compile_for(plans, opt.state, torch.device(DEVICE))
    assert len(later) == 1 and "_upper_tiles_persistent" in kernel_names(now[-1])
    assert len(rehearsals) == 1  # everything compiled already: no second rehearsal with the stand-in
    kernels_on.clear()
    opt.step()
    assert "_upper_tiles_persistent" in kernel_names(kernels_on) and "_upper_tiles_tma" not in kernel_names(kernels_on)
    monkeypatch.setattr(launches, "COMPILED", set())
    opt.param_groups[0]["compute_dtype"] = torch.float32  # no product takes the kernel (bf16/fp16): nothing to warm
    plan.compile_for(plan.make_plan(opt.param_groups, opt.state, None), opt.state, torch.device(DEVICE))
    assert len(later) == 1 and symmetric_triton.WARMING == set()


def test_a_background_compile_calls_done_after_a_failure(monkeypatch):
    """compile_in_background runs compile_all on a thread and then `done`, even when compile_all raised (the
    error noted in FAILURES)."""
    def broken(noted, device):
        raise RuntimeError("no compiler")
    monkeypatch.setattr(launches, "compile_all", broken)
    monkeypatch.setattr(launches, "FAILURES", [])
    done = []
    launches.compile_in_background([], torch.device("cpu"), lambda: done.append(True))
    launches.wait()
    assert done == [True] and launches.BACKGROUND == []
    assert launches.FAILURES == ["background compile: RuntimeError: no compiler"]
