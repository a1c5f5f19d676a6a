"""First step in a fresh process: import, construction + first step, second step; optional cProfile of the first."""
import sys, time
t0 = time.perf_counter()
import torch
torch.cuda.init(); torch.empty(1, device="cuda")
t1 = time.perf_counter()
sys.path.insert(0, "benchmarks")
import gpu_step, optimizers
from optimizers import symmetric, elementwise
t2 = time.perf_counter()
name, cfg = sys.argv[1], sys.argv[2]
ps = gpu_step.make_params(gpu_step.SETS[name](1.0), torch.device("cuda")); torch.cuda.synchronize()
symmetric.TRITON = "sym" in cfg; elementwise.TRITON = "elem" in cfg
orth = "gram_newton_schulz" if "gram" in cfg else "polar_express"
def first():
    opt = optimizers.Muon(ps, flatten=True, orthogonalizer=orth, cuda_graphs="graphs" in cfg)
    opt.step(); torch.cuda.synchronize(); return opt
t3 = time.perf_counter()
if "prof" in sys.argv[3:]:
    import cProfile, pstats
    pr = cProfile.Profile(); pr.enable(); opt = first(); pr.disable()
else:
    opt = first()
t4 = time.perf_counter()
opt.step(); torch.cuda.synchronize(); t5 = time.perf_counter()
from optimizers.optional import triton_module
k = triton_module("symmetric_triton")
print(f"{name} {cfg}: torch+cuda {t1-t0:.2f} s, import ours {t2-t1:.2f} s, first step {t4-t3:.2f} s, second {t5-t4:.2f} s")
if "prof" in sys.argv[3:]:
    pstats.Stats(pr).sort_stats("cumulative").print_stats(30)
