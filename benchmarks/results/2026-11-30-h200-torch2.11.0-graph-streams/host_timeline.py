"""Host timeline of a graphed step: step start -> flush -> return; GPU step time; cProfile of 50 steps."""
import sys, time, statistics, cProfile, pstats, torch
sys.path.insert(0, "benchmarks")
import gpu_step, optimizers
from optimizers import elementwise, graphs
for name, orth, fused in [("convnext_t", "polar_express", False), ("gpt2_small", "gram_newton_schulz", True)]:
    elementwise.TRITON = fused
    ps = gpu_step.make_params(gpu_step.SETS[name](1.0), torch.device("cuda"))
    opt = optimizers.Muon(ps, flatten=True, orthogonalizer=orth, cuda_graphs=True)
    for _ in range(5): opt.step()
    torch.cuda.synchronize()
    marks = {}
    flush, replay = graphs.PlanGraphs.flush, graphs.PlanGraphs._replay
    def f(self):
        marks["flush"] = time.perf_counter(); return flush(self)
    def r(self):
        marks["replay"] = time.perf_counter(); replay(self); marks["replayed"] = time.perf_counter()
    graphs.PlanGraphs.flush, graphs.PlanGraphs._replay = f, r
    rows = []
    for _ in range(30):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter(); s.record(); opt.step(); e.record(); t1 = time.perf_counter(); torch.cuda.synchronize()
        rows.append(((marks["flush"] - t0) * 1e3, (marks["replay"] - t0) * 1e3, (marks["replayed"] - t0) * 1e3, (t1 - t0) * 1e3, s.elapsed_time(e)))
    graphs.PlanGraphs.flush, graphs.PlanGraphs._replay = flush, replay
    med = [statistics.median(c) for c in zip(*rows)]
    print(f"== {name} {orth} fused={fused}: host ms to flush {med[0]:.3f}, to replay {med[1]:.3f}, replay returned {med[2]:.3f}, step returned {med[3]:.3f}; GPU step {med[4]:.3f}")
    pr = cProfile.Profile(); pr.enable()
    for _ in range(50): opt.step()
    torch.cuda.synchronize(); pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(22)
    del opt, ps; torch.cuda.empty_cache()
