"""GPT-2: where the step's time goes (host enqueue vs GPU), with and without the per-megabatch Gram checks."""
import sys, time, statistics, warnings, torch
sys.path.insert(0, "benchmarks")
import gpu_step, optimizers
from optimizers import elementwise, graphs, symmetric
dev = torch.device("cuda")
def med(opt, n=30):
    for _ in range(5): opt.step()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter(); s.record(); opt.step(); e.record(); host = time.perf_counter() - t0
        torch.cuda.synchronize(); ts.append((s.elapsed_time(e), host * 1e3))
    return statistics.median(t for t, _ in ts), statistics.median(h for _, h in ts)
orig = graphs.Graphed.run
def nocheck(self, directions):
    if not self.static:
        torch.stack(directions, out=self.input)
    self._replay(); self.replays += 1
    return self.output
for name in ["gpt2_small", "convnext_t"]:
  for orth in ["gram_newton_schulz", "polar_express", "newton_schulz"]:
    for fused in [False, True]:
      for skip in [False, True]:
        elementwise.TRITON = fused
        graphs.Graphed.run = nocheck if skip else orig
        ps = gpu_step.make_params(gpu_step.SETS[name](1.0), dev)
        opt = optimizers.Muon(ps, flatten=True, orthogonalizer=orth, cuda_graphs=True)
        gpu_ms, host_ms = med(opt)
        torch.cuda.set_sync_debug_mode(1)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always"); opt.step()
        torch.cuda.set_sync_debug_mode(0)
        print(f"{name} {orth} fused={fused} skip_checks={skip}: step {gpu_ms:.3f} ms (events), host {host_ms:.3f} ms, syncs {len(w)}", flush=True)
        del opt, ps; torch.cuda.empty_cache()
graphs.Graphed.run = orig
