"""llama24 fastest config: per-step times, allocator counters."""
import sys, statistics, torch
sys.path.insert(0, "benchmarks")
import gpu_step, optimizers
from optimizers import symmetric, elementwise
symmetric.TRITON = elementwise.TRITON = True
ps = gpu_step.make_params(gpu_step.SETS["llama24"](1.0), torch.device("cuda"))
opt = optimizers.Muon(ps, flatten=True, orthogonalizer="gram_newton_schulz")
for _ in range(3): opt.step()
torch.cuda.synchronize()
keys = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")
m0 = torch.cuda.memory_stats()
t = []
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 8):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); opt.step(); e.record(); torch.cuda.synchronize(); t.append(s.elapsed_time(e))
m1 = torch.cuda.memory_stats()
print("steps ms:", " ".join(f"{x:.1f}" for x in t), f"median {statistics.median(t):.1f}")
print("allocator deltas:", {k: m1.get(k, 0) - m0.get(k, 0) for k in keys},
      f"reserved {m1['reserved_bytes.all.current'] / 2**30:.1f} GiB peak alloc {m1['allocated_bytes.all.peak'] / 2**30:.1f} GiB")
