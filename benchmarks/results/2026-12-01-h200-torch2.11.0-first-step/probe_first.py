"""First step breakdown in a fresh process: python probe_first.py SET CFG [dynamo] [prof] [noahead]
CFG: gram|pe, +sym (Triton symmetric products), +elem (fused elementwise), +graphs; dynamo: import torch._dynamo
first (as in benchmarks/gpu_step.py, after torch.optim.Muon's rows); noahead: plan.compile_ahead off."""
import sys, time
T = {}
t0 = time.perf_counter()
import torch
torch.cuda.init(); torch.empty(1, device="cuda")
T["torch+cuda"] = time.perf_counter() - t0
if "dynamo" in sys.argv[3:]:
    t = time.perf_counter(); import torch._dynamo; T["import dynamo"] = time.perf_counter() - t
t = time.perf_counter()
sys.path.insert(0, "benchmarks")
import gpu_step, optimizers
from optimizers import symmetric, elementwise
import triton, triton.compiler.compiler as tcc
T["import ours"] = time.perf_counter() - t
COMP = [0, 0.0]
_orig = tcc.compile
def timed_compile(*a, **k):
    s = time.perf_counter()
    try:
        return _orig(*a, **k)
    finally:
        COMP[0] += 1; COMP[1] += time.perf_counter() - s
tcc.compile = timed_compile
import triton.runtime.jit as tjit
if hasattr(tjit, "compile"):
    tjit.compile = timed_compile
name, cfg = sys.argv[1], sys.argv[2]
ps = gpu_step.make_params(gpu_step.SETS[name](1.0), torch.device("cuda")); torch.cuda.synchronize()
symmetric.TRITON = "sym" in cfg; elementwise.TRITON = "elem" in cfg
orth = "gram_newton_schulz" if "gram" in cfg else "polar_express"
prof = "prof" in sys.argv[3:]
if "noahead" in sys.argv[3:]:
    from optimizers import plan
    plan.compile_ahead = lambda plans, state: 0
else:
    from optimizers import plan
    _ahead = plan.compile_ahead
    def _timed(plans, state):
        s = time.perf_counter(); n = _ahead(plans, state)
        T[f"compile ahead #{sum(k.startswith('compile') for k in T) + 1} ({n})"] = time.perf_counter() - s; return n
    plan.compile_ahead = _timed
if prof:
    import cProfile, pstats
    pr = cProfile.Profile(); pr.enable()
t = time.perf_counter()
opt = optimizers.Muon(ps, flatten=True, orthogonalizer=orth, cuda_graphs="graphs" in cfg)
T["construct"] = time.perf_counter() - t
t = time.perf_counter(); opt.step(); T["first step host"] = time.perf_counter() - t
torch.cuda.synchronize(); T["first step +sync"] = time.perf_counter() - t
if prof:
    pr.disable()
t = time.perf_counter(); opt.step(); torch.cuda.synchronize(); T["second"] = time.perf_counter() - t
print(f"== {name} {cfg} {sys.argv[3:]}: " + ", ".join(f"{k} {v:.2f} s" for k, v in T.items())
      + f"; triton compiles {COMP[0]} in {COMP[1]:.2f} s")
from optimizers import launches
if launches.FAILURES:
    print("compile-ahead failures:", *launches.FAILURES[:6], sep="\n  ")
if prof:
    st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(25)
    st.sort_stats("cumulative").print_stats("optimizers|triton/runtime|triton/compiler|_dynamo/__init__|optim/optimizer", 40)
